"""The gateway's outbound client on the one trust store (docs/configuration.md, "Trust store and
proxies"): the ds connector (its EDR key set, asked with the gateway's service bearer) and the
OIDC issuer (that bearer's token endpoint, and the key set user tokens are verified with), each
served over HTTPS with a certificate of a CA made at test time. The client is the service's own
(`connector_http`), verification stays on; the only difference between the two tests is
DATAPLANE_CA_BUNDLE."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from dataplane_local.doubles.ds_connector import DsConnectorDouble, create_app
from dataplane_local.doubles.oidc import OidcIssuer
from dataplane_service_kit.errors import ServiceError
from dataplane_testing.gateway import AUDIENCE, CACHE_SECRET, CATALOGUE, CLIENT_ID, CLIENT_SECRET
from dataplane_testing.tls import PrivateCa, issuer_and_double
from query_gateway.clients.connector import ConnectorClient, connector_http, service_tokens
from query_gateway.clients.identity import OidcVerifier
from query_gateway.settings import Settings

pytestmark = pytest.mark.usefixtures("plain_trust_environment")
CONSUMER = "did:web:consumer.example"


@dataclass
class TlsWorld:
    ca: PrivateCa
    issuer: OidcIssuer
    ds: DsConnectorDouble
    ds_url: str

    def settings(self, *, with_bundle: bool) -> Settings:
        extra = {"dataplane_ca_bundle": self.ca.ca_file} if with_bundle else {}
        return Settings(
            catalogue_path=str(CATALOGUE),
            datasets_database_url="postgresql://127.0.0.1:1/unused",
            redis_url="redis://127.0.0.1:1/0",
            kafka_bootstrap_servers="127.0.0.1:1",
            row_filters_cache_key_secret=CACHE_SECRET,
            celine_oidc_base_url=self.issuer.base_url,
            celine_oidc_audience=AUDIENCE,
            celine_oidc_client_id=CLIENT_ID,
            celine_oidc_client_secret=CLIENT_SECRET,
            connector_internal_url=self.ds_url,
            **extra,
        )


@pytest.fixture(scope="module")
def world(private_ca_files: PrivateCa) -> Iterator[TlsWorld]:
    ds = DsConnectorDouble()
    clients = {CLIENT_ID: CLIENT_SECRET}
    with issuer_and_double(private_ca_files, clients, create_app(ds)) as (issuer, server):
        yield TlsWorld(private_ca_files, issuer, ds, server.url)


async def _verify_both(world: TlsWorld, settings: Settings) -> tuple[str, str]:
    """(the EDR's verified consumer, the user token's verified subject), on the gateway's client."""
    async with connector_http(settings) as http:
        connector = ConnectorClient(http, settings, service_tokens(http, settings))
        edr = await connector.verify_edr(world.ds.mint_edr(CONSUMER))
        oidc = OidcVerifier(http, settings.oidc_jwks_uri(), settings.oidc_issuer(), AUDIENCE)
        caller = await oidc.verify(world.issuer.mint({"sub": "user-1"}, audience=AUDIENCE))
    return edr.consumer, caller.sub


async def test_ds_and_the_issuer_behind_a_private_ca_are_trusted_with_the_bundle(world: TlsWorld) -> None:
    tokens_before = world.issuer.token_requests
    assert await _verify_both(world, world.settings(with_bundle=True)) == (CONSUMER, "user-1")
    assert world.issuer.token_requests == tokens_before + 1  # the bearer ds was asked with
    (call,) = world.ds.calls("jwks")[-1:]
    assert call.headers["authorization"].startswith("Bearer ")


async def test_without_the_bundle_neither_ds_nor_the_issuer_is_trusted(world: TlsWorld) -> None:
    jwks_before = world.issuer.jwks_requests
    with pytest.raises(ServiceError) as refused:
        await _verify_both(world, world.settings(with_bundle=False))
    assert refused.value.code == "ds_unavailable"  # the token endpoint failed its handshake
    async with connector_http(world.settings(with_bundle=False)) as http:
        oidc = OidcVerifier(http, f"{world.issuer.base_url}/protocol/openid-connect/certs", None, None)
        with pytest.raises(ServiceError, match="cannot be verified now"):
            await oidc.verify(world.issuer.mint({"sub": "user-1"}))
    assert world.issuer.jwks_requests == jwks_before  # no handshake completed, no request served
