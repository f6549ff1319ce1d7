"""The one trust store and proxy rule of every outbound client (docs/configuration.md, "Trust store
and proxies"; docs/operations.md, "A corporate CA or proxy").

Every client that leaves the process (ds, the issuer and its key set, the REC registry, http-in-list
endpoints, DPS callbacks and did:web documents, the EDC control plane, the relay's posts) verifies
TLS against one `ssl.SSLContext` built here:

- the system trust store: the operating system's verifier on macOS and Windows (`truststore`),
  OpenSSL's default file and directory on Linux (which `SSL_CERT_FILE` and `SSL_CERT_DIR`
  replace, as for any OpenSSL program). certifi's bundle, httpx's default, is not used: a CA an
  operator installs in the image or the host is then trusted by every client at once;
- plus, when `DATAPLANE_CA_BUNDLE` names a PEM file, the CA certificates in it (a corporate or
  private CA mounted by the chart, `caBundle`).

httpx clients are built with `trust_env=True`, so `HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY` and
`NO_PROXY` apply to them; the relay's own HTTP/1.1 client reads the same variables through
`proxy_for` (audit_relay.http1)."""

from __future__ import annotations

import base64
import os
import ssl
import sys
import urllib.request
from dataclasses import dataclass
from os import PathLike
from typing import Any
from urllib.parse import unquote, urlsplit

import httpx
import truststore

from dataplane_contracts.settings import OutboundTlsSettings

# where Linux distributions keep the system bundle, for an OpenSSL built with other default paths
# (a Python from a build elsewhere): Debian/Ubuntu, RHEL/Fedora, Alpine/Arch, SUSE
_LINUX_BUNDLES = (
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
    "/etc/ssl/cert.pem",
    "/etc/ssl/ca-bundle.pem",
)


def _system_context() -> ssl.SSLContext:
    if sys.platform in ("darwin", "win32"):
        return truststore.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    # On Linux truststore verifies with OpenSSL's default paths too, but loads them again for
    # every connection: about 20 ms of CPU per handshake, measured here, where the resolver's
    # registry SDK opens a connection per call (issue 12). The same store, loaded once:
    ctx = ssl.create_default_context()  # verification and hostname checks on, default paths
    defaults = ssl.get_default_verify_paths()
    if defaults.cafile is None and defaults.capath is None:
        bundle = next((path for path in _LINUX_BUNDLES if os.path.isfile(path)), None)
        if bundle is not None:
            ctx.load_verify_locations(cafile=bundle)
    return ctx


def outbound_ssl_context(ca_bundle: str | PathLike[str] | None = None) -> ssl.SSLContext:
    """Verification on, hostnames checked, the system store plus `ca_bundle` when given."""
    ctx = _system_context()
    if ca_bundle is not None:
        ctx.load_verify_locations(cafile=ca_bundle)
    return ctx


def settings_ssl_context(settings: OutboundTlsSettings) -> ssl.SSLContext:
    return outbound_ssl_context(settings.dataplane_ca_bundle)


def _context(trust: OutboundTlsSettings | ssl.SSLContext) -> ssl.SSLContext:
    return trust if isinstance(trust, ssl.SSLContext) else settings_ssl_context(trust)


def outbound_http(trust: OutboundTlsSettings | ssl.SSLContext, **kwargs: Any) -> httpx.AsyncClient:
    """An httpx client on the one trust store (a context already built may be shared: loading a
    bundle into a new context is CPU a client need not spend twice), honouring the proxy
    variables."""
    return httpx.AsyncClient(verify=_context(trust), trust_env=True, **kwargs)


def outbound_http_sync(trust: OutboundTlsSettings | ssl.SSLContext, **kwargs: Any) -> httpx.Client:
    return httpx.Client(verify=_context(trust), trust_env=True, **kwargs)


@dataclass(frozen=True)
class Proxy:
    """An `http://` forward proxy: the origin is reached through it (CONNECT for `https`)."""

    host: str
    port: int
    authorization: str | None  # the Proxy-Authorization value, from user:password in the URL

    def __repr__(self) -> str:  # the credentials stay out of logs and errors
        return f"Proxy(host={self.host!r}, port={self.port})"


class UnsupportedProxy(ValueError):
    """A proxy variable this client cannot use (only `http://` proxies are)."""


def proxy_for(scheme: str, host: str) -> Proxy | None:
    """The proxy the standard variables name for a `scheme://host` origin, or None: no variable
    for the scheme (nor ALL_PROXY), or the host matched by NO_PROXY. The rule of urllib (and so of
    httpx's `trust_env`): lower-case variables win over upper-case ones."""
    proxies = urllib.request.getproxies()
    url = proxies.get(scheme) or proxies.get("all")
    if not url or urllib.request.proxy_bypass(host):
        return None
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme != "http" or not parts.hostname:
        # the variable's value is not echoed: it may carry a password
        raise UnsupportedProxy(f"the {scheme} proxy must be an http:// URL with a host")
    authorization = None
    if parts.username is not None:
        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        authorization = "Basic " + base64.b64encode(pair).decode("ascii")
    return Proxy(parts.hostname, parts.port or 80, authorization)
