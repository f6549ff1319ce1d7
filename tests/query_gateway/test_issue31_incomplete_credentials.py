"""Issue 31: a gateway configured with a client id but no secret fails closed on the dataspace
path, `502 ds_unavailable`, without asking the issuer for a token it cannot get and without
asking ds anything (dataplane_service_kit.oauth)."""

from __future__ import annotations

from dataplane_local.doubles.ds_connector import DsConnectorDouble
from dataplane_testing.gateway import World, edr_query, refused, running_gateway


async def test_issue31_a_client_id_without_its_secret_is_ds_unavailable_and_asks_no_one(
    world: World, ds: DsConnectorDouble
) -> None:
    async with running_gateway(world.settings(celine_oidc_client_secret=None)) as client:
        asked = world.issuer.token_requests
        refused(await edr_query(client, world, "SELECT id FROM stats"), 502, "ds_unavailable")
        assert world.issuer.token_requests == asked
        assert ds.calls("authorize") == []
