"""The one outbound trust store (dataplane_service_kit.outbound_tls, docs/configuration.md "Trust
store and proxies"): a real HTTPS server with a certificate from a CA made at test time, and the
httpx client every service builds from it. No verification is switched off anywhere."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from pydantic import ValidationError

from dataplane_contracts.settings import OutboundTlsSettings
from dataplane_local.doubles.server import RunningServer, serve_in_thread
from dataplane_service_kit.outbound_tls import UnsupportedProxy, outbound_http, proxy_for
from dataplane_service_kit.settings import describe_validation_error
from dataplane_testing.tls import PrivateCa, connect_proxy

pytestmark = pytest.mark.usefixtures("plain_trust_environment")


@pytest.fixture(scope="module")
def ca(private_ca_files: PrivateCa) -> PrivateCa:
    return private_ca_files


@pytest.fixture(scope="module")
def https_server(ca: PrivateCa) -> Iterator[RunningServer]:
    app = FastAPI()

    @app.get("/ping")
    async def ping() -> dict[str, bool]:
        return {"ok": True}

    server = serve_in_thread(app, tls=ca.server)
    yield server
    server.stop()


async def test_a_private_ca_in_dataplane_ca_bundle_is_trusted(
    ca: PrivateCa, https_server: RunningServer
) -> None:
    settings = OutboundTlsSettings(dataplane_ca_bundle=ca.ca_file)
    async with outbound_http(settings) as http:
        answer = await http.get(f"{https_server.url}/ping")
    assert answer.status_code == 200 and answer.json() == {"ok": True}


async def test_without_the_bundle_the_private_ca_fails_verification(https_server: RunningServer) -> None:
    async with outbound_http(OutboundTlsSettings()) as http:
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            await http.get(f"{https_server.url}/ping")


async def test_ssl_cert_file_replaces_the_default_file_as_for_openssl(
    ca: PrivateCa, https_server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(ca.ca_file))
    async with outbound_http(OutboundTlsSettings()) as http:
        assert (await http.get(f"{https_server.url}/ping")).status_code == 200


async def test_https_proxy_tunnels_the_httpx_clients_and_no_proxy_bypasses_it(
    ca: PrivateCa, https_server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = OutboundTlsSettings(dataplane_ca_bundle=ca.ca_file)
    with connect_proxy() as proxy:
        monkeypatch.setenv("HTTPS_PROXY", proxy.url)
        async with outbound_http(settings) as http:
            assert (await http.get(f"{https_server.url}/ping")).status_code == 200
        assert proxy.request_lines == [f"CONNECT 127.0.0.1:{https_server.port} HTTP/1.1"]
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        async with outbound_http(settings) as http:
            assert (await http.get(f"{https_server.url}/ping")).status_code == 200
        assert len(proxy.request_lines) == 1  # the second request went straight to the server


def test_proxy_for_reads_the_variables_and_keeps_credentials_out_of_its_repr(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://relay:s%40cret@proxy.corp:3128")
    monkeypatch.setenv("NO_PROXY", "ds.internal,.svc.cluster.local")
    proxy = proxy_for("https", "ds.example.org")
    assert proxy is not None and (proxy.host, proxy.port) == ("proxy.corp", 3128)
    assert proxy.authorization == "Basic cmVsYXk6c0BjcmV0"  # relay:s@cret
    assert "cret" not in repr(proxy)
    assert proxy_for("https", "ds.internal") is None
    assert proxy_for("https", "ds.ns.svc.cluster.local") is None
    assert proxy_for("http", "ds.example.org") is None  # no HTTP_PROXY, no ALL_PROXY
    monkeypatch.setenv("HTTPS_PROXY", "socks5://proxy.corp:1080")
    with pytest.raises(UnsupportedProxy) as refused:
        proxy_for("https", "ds.example.org")
    assert "proxy.corp" not in str(refused.value)


def test_a_bundle_that_is_not_pem_stops_the_start_naming_the_variable(tmp_path: Path) -> None:
    bogus = tmp_path / "ca.pem"
    bogus.write_text("not a certificate\n")
    for value in (bogus, tmp_path / "missing.pem"):
        with pytest.raises(ValidationError) as refused:
            OutboundTlsSettings(dataplane_ca_bundle=value)
        assert describe_validation_error(refused.value, OutboundTlsSettings).startswith(
            "invalid configuration: DATAPLANE_CA_BUNDLE:"
        )
