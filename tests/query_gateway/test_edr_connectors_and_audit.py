"""Connector resolution (docs/gateway.md) with dedicated gateways, and the disclosure gate: with a
dedicated broker stopped, a dataspace query is 503 audit_unavailable and serves no rows."""

from __future__ import annotations

import json
from pathlib import Path

from dataplane_contracts.topics import topic_specs
from dataplane_local import infra
from dataplane_local.doubles.ds_connector import DsConnectorDouble
from dataplane_service_kit.topics_cli import create_topics
from dataplane_testing.gateway import AGREEMENT, CONSUMER, PROVIDER, World, ds_policy, running_gateway

OTHER = "did:web:other-provider.example"


def headers(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "Edc-Contract-Agreement-Id": AGREEMENT}


async def test_each_provider_is_served_by_its_own_connector_and_an_unlisted_one_is_401(
    world: World, ds: DsConnectorDouble
) -> None:
    policy = ds_policy(["stats"])
    policy["participants"] = {"other": {"participant_id": OTHER, "agreements": policy["agreements"]}}
    ds.set_policy(policy)
    urls = {PROVIDER: world.ds_url + "/", OTHER: world.ds_url + "/other"}
    async with running_gateway(
        world.settings(connector_internal_url=None, connector_internal_urls=json.dumps(urls))
    ) as c:
        r = await c.post(
            "/query",
            json={"sql": "SELECT id FROM stats ORDER BY id"},
            headers=headers(ds.mint_edr(CONSUMER, AGREEMENT, participant="other")),
        )
        assert r.status_code == 200, r.text
        assert r.json()["items"] == [{"id": 1}, {"id": 2}]
        assert [call.participant for call in ds.calls("authorize")] == ["other"]
        # the root provider's token goes to the root connector, with the same rows
        r = await c.post(
            "/query",
            json={"sql": "SELECT id FROM stats ORDER BY id"},
            headers=headers(ds.mint_edr(CONSUMER, AGREEMENT)),
        )
        assert r.status_code == 200, r.text
        assert r.json()["items"] == [{"id": 1}, {"id": 2}]
        assert [call.participant for call in ds.calls("authorize")] == ["other", ""]
    async with running_gateway(
        world.settings(connector_internal_urls=json.dumps({PROVIDER: world.ds_url}))
    ) as c:
        r = await c.post(
            "/query",
            json={"sql": "SELECT id FROM stats"},
            headers=headers(ds.mint_edr(CONSUMER, AGREEMENT, participant="other")),
        )
        assert r.status_code == 401
        assert r.json()["error"] == "provider_not_served"


async def test_no_connector_configured_is_503_ds_not_configured(world: World, ds: DsConnectorDouble) -> None:
    async with running_gateway(world.settings(connector_internal_url=None)) as c:
        r = await c.post("/query", json={"sql": "SELECT id FROM stats"}, headers=headers(world.edr()))
        assert r.status_code == 503
        assert r.json()["error"] == "ds_not_configured"


async def test_edr_disabled_leaves_the_header_inert(world: World, ds: DsConnectorDouble) -> None:
    async with running_gateway(world.settings(edr_enabled=False)) as c:
        r = await c.post("/query", json={"sql": "SELECT id FROM stats"}, headers=headers(world.edr()))
        assert r.status_code == 401
        assert r.json()["error"] == "invalid_token"  # the EDR token went to the OIDC check
    assert ds.calls() == []


async def test_a_stopped_broker_is_503_audit_unavailable_with_no_rows(
    world: World, ds: DsConnectorDouble, tmp_path: Path
) -> None:
    broker = infra.start_kafka(tmp_path / "kafka")
    try:
        await create_topics(broker.url, topic_specs())
        ds.set_policy(ds_policy(["stats"]))
        settings = world.settings(kafka_bootstrap_servers=broker.url, audit_publish_timeout_ms=1500)
        async with running_gateway(settings) as c:
            ok = await c.post("/query", json={"sql": "SELECT id FROM stats"}, headers=headers(world.edr()))
            assert ok.status_code == 200, ok.text
            broker.stop()
            r = await c.post("/query", json={"sql": "SELECT id FROM stats"}, headers=headers(world.edr()))
            assert r.status_code == 503
            assert r.json() == {
                "type": "urn:dataplane:error:audit_unavailable",
                "title": "Audit unavailable",
                "status": 503,
                "error": "audit_unavailable",
                "detail": "disclosure could not be recorded; no rows served",
            }
    finally:
        broker.stop()


def test_startup_refuses_dps_without_its_public_key(world: World) -> None:
    import pytest
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="DPS_TOKEN_PUBLIC_KEY"):
        world.settings(dps_enabled=True, dps_flows_database_url="postgresql://x/y")
    with pytest.raises(ValidationError, match="PEM"):
        world.settings(dps_token_public_key="not a key")


def _catalogue(tmp_path: Path, person: str) -> str:
    path = tmp_path / "catalogue.yaml"
    path.write_text(
        "datasets:\n"
        "  - id: readings\n"
        "    table: readings\n"
        "    row_filters:\n"
        f"      person: {person}\n"
        "      organization: {handler: allow_all, binds: organization}\n"
    )
    return str(path)


async def test_gs08_startup_refuses_binds_contradicting_the_handler(world: World, tmp_path: Path) -> None:
    import pytest

    from query_gateway.app import StartupRefused

    bad = _catalogue(
        tmp_path, "{handler: subject_key_match, binds: organization, args: {column: pod, key_type: pod}}"
    )
    with pytest.raises(StartupRefused, match=r"readings.*subject_key_match"):
        async with running_gateway(world.settings(catalogue_path=bad)):
            pass


async def test_gs09_startup_refuses_a_filter_column_the_table_lacks(world: World, tmp_path: Path) -> None:
    import pytest

    from query_gateway.app import StartupRefused

    bad = _catalogue(tmp_path, "{handler: subject_key_match, args: {column: nope, key_type: pod}}")
    with pytest.raises(StartupRefused, match=r"readings[\s\S]*nope"):
        async with running_gateway(world.settings(catalogue_path=bad)):
            pass
