"""The relay's own HTTP/1.1 client (audit_relay.http1) on the one outbound trust store and behind a
corporate proxy (docs/configuration.md, "Trust store and proxies"): a ds double served over HTTPS
with a certificate of a CA made at test time, and a forward-proxy double, both real sockets."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from audit_relay.delivery import ConnectorPools, PostFailed
from dataplane_local.doubles.server import RunningServer, serve_in_thread
from dataplane_service_kit.outbound_tls import outbound_ssl_context
from dataplane_testing.audit_relay import ObservingDs
from dataplane_testing.tls import PrivateCa, connect_proxy

pytestmark = pytest.mark.usefixtures("plain_trust_environment")

AUDIT = "/internal/audit/query"
BODY = json.dumps({"event": "disclosure"}).encode()


@pytest.fixture(scope="module")
def ca(private_ca_files: PrivateCa) -> PrivateCa:
    return private_ca_files


@pytest.fixture(scope="module")
def ds() -> ObservingDs:
    return ObservingDs()


@pytest.fixture(scope="module")
def https_ds(ca: PrivateCa, ds: ObservingDs) -> Iterator[RunningServer]:
    server = serve_in_thread(ds.app(), tls=ca.server)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def http_ds(ds: ObservingDs) -> Iterator[RunningServer]:
    server = serve_in_thread(ds.app())
    yield server
    server.stop()


async def _post(pools: ConnectorPools, base: str, *keys: str) -> int:
    """Post once per key on the pools (one connection kept alive between them); the last status."""
    status = 0
    try:
        for key in keys:
            status, _ = await pools.post(base, base + AUDIT, BODY, {"Idempotency-Key": key})
    finally:
        await pools.aclose()
    return status


async def test_the_relay_posts_to_an_https_ds_whose_ca_is_in_the_bundle(
    ca: PrivateCa, ds: ObservingDs, https_ds: RunningServer
) -> None:
    pools = ConnectorPools(max_in_flight=1, timeout_s=5, tls=outbound_ssl_context(ca.ca_file))
    assert await _post(pools, https_ds.url, "tls-trusted") == 200
    assert ds.accepted(["tls-trusted"]) == ["tls-trusted"]


async def test_without_the_bundle_the_relay_refuses_the_private_ca(https_ds: RunningServer) -> None:
    pools = ConnectorPools(max_in_flight=1, timeout_s=5, tls=outbound_ssl_context())
    with pytest.raises(PostFailed, match="SSLCertVerificationError"):
        await _post(pools, https_ds.url, "tls-untrusted")


async def test_https_proxy_carries_the_relays_posts_through_a_connect_tunnel(
    ca: PrivateCa, ds: ObservingDs, https_ds: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    with connect_proxy() as proxy:
        monkeypatch.setenv("HTTPS_PROXY", proxy.url.replace("http://", "http://relay:pw@"))
        pools = ConnectorPools(max_in_flight=1, timeout_s=5, tls=outbound_ssl_context(ca.ca_file))
        assert await _post(pools, https_ds.url, "via-proxy-1", "via-proxy-2") == 200
    # one tunnel, kept alive for the second post
    assert proxy.request_lines == [f"CONNECT 127.0.0.1:{https_ds.port} HTTP/1.1"]
    assert proxy.proxy_authorizations == ["Basic cmVsYXk6cHc="]  # relay:pw, to the proxy only
    # TLS end to end, with ds's certificate
    assert ds.accepted(["via-proxy-1", "via-proxy-2"]) == ["via-proxy-1", "via-proxy-2"]


async def test_no_proxy_hosts_are_posted_to_directly(
    ca: PrivateCa, ds: ObservingDs, https_ds: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    with connect_proxy() as proxy:
        monkeypatch.setenv("HTTPS_PROXY", proxy.url)
        monkeypatch.setenv("NO_PROXY", "localhost,127.0.0.1")
        pools = ConnectorPools(max_in_flight=1, timeout_s=5, tls=outbound_ssl_context(ca.ca_file))
        assert await _post(pools, https_ds.url, "bypassed") == 200
    assert proxy.request_lines == []
    assert ds.accepted(["bypassed"]) == ["bypassed"]


async def test_http_proxy_gets_a_plain_http_post_in_absolute_form(
    http_ds: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    with connect_proxy() as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        pools = ConnectorPools(max_in_flight=1, timeout_s=5)
        assert await _post(pools, http_ds.url, "forwarded") == 204  # the proxy double's own answer
    assert proxy.request_lines == [f"POST {http_ds.url}{AUDIT} HTTP/1.1"]


def test_a_proxy_the_relay_cannot_use_stops_its_start(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import ValidationError

    from audit_relay.settings import Settings

    monkeypatch.setenv("HTTPS_PROXY", "socks5://user:secret@proxy.corp:1080")
    with pytest.raises(ValidationError) as refused:
        Settings(kafka_bootstrap_servers="127.0.0.1:1", connector_internal_url="https://ds.example.org")
    assert "the https proxy must be an http:// URL" in str(refused.value)
    assert "secret" not in str(refused.value)
    monkeypatch.setenv("NO_PROXY", "ds.example.org")  # a connector not proxied: no objection
    Settings(kafka_bootstrap_servers="127.0.0.1:1", connector_internal_url="https://ds.example.org")
