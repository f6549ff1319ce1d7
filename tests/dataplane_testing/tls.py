"""A private CA made at test time, and a forward-proxy double: the corporate set-up of
docs/operations.md ("A corporate CA or proxy") on loopback.

`private_ca` writes a CA certificate (the bundle an operator would mount) and a server
certificate it signed for 127.0.0.1 and localhost; the system store knows nothing of this CA, so a
client trusts the doubles served with it only when it is given the bundle. `ConnectProxy` is an
HTTP forward proxy on loopback: it tunnels CONNECT to the named host and answers a forwarded
(absolute-form) request itself, and records every request line it saw."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from fastapi import FastAPI

from dataplane_local.doubles.oidc import OidcIssuer, start_oidc_issuer
from dataplane_local.doubles.server import RunningServer, serve_in_thread


@dataclass(frozen=True)
class PrivateCa:
    ca_file: Path  # the CA certificate (PEM): DATAPLANE_CA_BUNDLE
    cert_file: Path  # the server's certificate, signed by the CA
    key_file: Path  # the server's key

    @property
    def server(self) -> tuple[str, str]:
        """What `serve_in_thread(tls=...)` takes."""
        return str(self.cert_file), str(self.key_file)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def private_ca(directory: Path) -> PrivateCa:
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(_name("dataplane test CA"))
        .issuer_name(_name("dataplane test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("127.0.0.1"))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    ca_file, cert_file, key_file = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    ca_file.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(_pem_key(key))
    return PrivateCa(ca_file, cert_file, key_file)


@dataclass
class ConnectProxy:
    """A forward proxy on loopback, served from its own thread and event loop."""

    port: int = 0
    request_lines: list[str] = field(default_factory=list)
    proxy_authorizations: list[str | None] = field(default_factory=list)
    _loop: asyncio.AbstractEventLoop | None = None
    _server: asyncio.Server | None = None
    _thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        started = threading.Event()

        def run() -> None:
            loop = self._loop = asyncio.new_event_loop()
            self._server = loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
            self.port = self._server.sockets[0].getsockname()[1]
            started.set()
            loop.run_forever()
            self._server.close()
            loop.run_until_complete(self._server.wait_closed())
            loop.close()

        self._thread = threading.Thread(target=run, name="connect-proxy", daemon=True)
        self._thread.start()
        started.wait(10)

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            writer.close()
            return
        line, *header_lines = head.split("\r\n")
        headers = {
            name.strip().lower(): value.strip()
            for name, _, value in (h.partition(":") for h in header_lines if h)
        }
        self.request_lines.append(line)
        self.proxy_authorizations.append(headers.get("proxy-authorization"))
        method, target, _ = line.split(" ", 2)
        if method != "CONNECT":
            # a forwarded request: answered here, which is enough to show it came through
            await reader.readexactly(int(headers.get("content-length", "0")))
            writer.write(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")
            await writer.drain()
            writer.close()
            return
        host, _, port = target.rpartition(":")
        try:
            up_reader, up_writer = await asyncio.open_connection(host.strip("[]"), int(port))
        except OSError:
            writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
            writer.close()
            return
        writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        await writer.drain()
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    with contextlib.suppress(OSError):
        writer.close()


@contextlib.contextmanager
def connect_proxy() -> Iterator[ConnectProxy]:
    proxy = ConnectProxy()
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()


# unset by the `plain_trust_environment` fixture (tests/conftest.py), both spellings
PROXY_VARIABLES = ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "NO_PROXY")


@contextlib.contextmanager
def issuer_and_double(
    ca: PrivateCa, clients: dict[str, str], app: FastAPI
) -> Iterator[tuple[OidcIssuer, RunningServer]]:
    """An OIDC issuer double and another double, both served over HTTPS with `ca`'s certificate."""
    issuer, issuer_server = start_oidc_issuer(clients=clients, tls=ca.server)
    server = serve_in_thread(app, tls=ca.server)
    try:
        yield issuer, server
    finally:
        server.stop()
        issuer_server.stop()
