"""The resolver's outbound clients on the one trust store (docs/configuration.md, "Trust store and
proxies"): the REC registry (through celine-sdk for a person, the resolver's own client for a
delegated lookup) and the OIDC issuer (the lookup's client-credentials token), both served over
HTTPS with certificates of a CA made at test time. The runtime is the service's own
(`open_runtime`); nothing in it is patched, and verification stays on."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from dataplane_local.doubles.oidc import OidcIssuer
from dataplane_local.doubles.rec_registry import RecRegistryDouble
from dataplane_local.doubles.rec_registry import create_app as registry_app
from dataplane_testing.resolver import (
    CLIENT_ID,
    CLIENT_SECRET,
    claim,
    make_settings,
    person,
    service_account,
)
from dataplane_testing.tls import PrivateCa, issuer_and_double
from filter_resolver.app import Runtime, open_runtime
from filter_resolver.metrics import Metrics
from filter_resolver.settings import Settings

pytestmark = pytest.mark.usefixtures("plain_trust_environment")
METERED = [{"key": "a1", "name": "Meter 1", "sensor_id": "POD-1"}]


@dataclass
class TlsDoubles:
    ca: PrivateCa
    issuer: OidcIssuer
    registry: RecRegistryDouble
    registry_url: str


@pytest.fixture(scope="module")
def tls_doubles(private_ca_files: PrivateCa) -> Iterator[TlsDoubles]:
    registry = RecRegistryDouble()
    registry.set_member("alice", METERED, user_id="u-alice")
    clients = {CLIENT_ID: CLIENT_SECRET}
    with issuer_and_double(private_ca_files, clients, registry_app(registry)) as (issuer, server):
        yield TlsDoubles(private_ca_files, issuer, registry, server.url)


def _settings(doubles: TlsDoubles, *, with_bundle: bool) -> Settings:
    extra = {"dataplane_ca_bundle": doubles.ca.ca_file} if with_bundle else {}
    return make_settings(
        celine_oidc_base_url=doubles.issuer.base_url, rec_registry_url=doubles.registry_url, **extra
    )


async def _resolve(settings: Settings, *checks: object) -> list[object]:
    runtime: Runtime = open_runtime(settings, Metrics(), [])
    handler = runtime.registry.get("rec_registry")
    assert handler is not None
    try:
        return [await handler.resolve(check) for check in checks]  # type: ignore[arg-type]
    finally:
        await runtime.aclose()


async def test_rec_registry_and_issuer_behind_a_private_ca_are_trusted_with_the_bundle(
    tls_doubles: TlsDoubles,
) -> None:
    own = claim("rec_registry", {"column": "sensor_id"}, caller=person(tls_doubles.issuer, "alice"))
    delegated = claim(
        "rec_registry",
        {"column": "sensor_id"},
        caller=service_account(tls_doubles.issuer),
        principals=("u-alice",),
    )
    tokens_before = tls_doubles.issuer.token_requests
    plans = await _resolve(_settings(tls_doubles, with_bundle=True), own, delegated)
    assert [p.values for p in plans] == [("POD-1",), ("POD-1",)]  # type: ignore[attr-defined]
    assert tls_doubles.issuer.token_requests == tokens_before + 1  # the lookup's token, over TLS


async def test_without_the_bundle_the_registry_is_not_reached(tls_doubles: TlsDoubles) -> None:
    calls_before = len(tls_doubles.registry.calls())
    own = claim("rec_registry", {"column": "sensor_id"}, caller=person(tls_doubles.issuer, "alice"))
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        await _resolve(_settings(tls_doubles, with_bundle=False), own)
    assert len(tls_doubles.registry.calls()) == calls_before  # refused in the handshake
