"""Dataspace refusals across processes: ds unreachable — answering 503, too slow to answer, or
refusing the connection — (502, nothing served, nothing published), a filter with an unknown
field (RF-02, 502), an unknown handler (RF-06, 403), and an empty allow-list (no rows)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx
import pytest

from dataplane_contracts.topics import AUDIT_DISCLOSURES, PLAN_REQUESTS
from dataplane_local.demo import DEMO_AGREEMENT, Wire, control_plane_token, pull, start_pull_flow
from dataplane_testing.e2e import System

pytestmark = pytest.mark.e2e


def _verdict(row_filter: dict[str, Any]) -> dict[str, Any]:
    return {"dataset_id": "meter_readings", "decision": "allow", "row_filter": row_filter}


SKM = {"handler": "subject_key_match", "args": {"column": "pod", "key_type": "pod"}}


def _fresh() -> str:
    """A transfer ds has not been asked about: each gateway may reuse ds's answer to the same
    question for the ttl ds gave it, and a refusal test needs ds to be asked."""
    return f"tp-{uuid.uuid4().hex[:12]}"


async def test_ds_unreachable_refuses_502_serves_nothing_publishes_nothing(system: System) -> None:
    wire = Wire(system.http)
    flow = await start_pull_flow(wire, system.info, await control_plane_token(wire, system.info))
    edr = await system.edr_token(DEMO_AGREEMENT)
    topics = (AUDIT_DISCLOSURES, PLAN_REQUESTS)
    before = {t: await system.end_offset(t) for t in topics}
    await system.ds_control({"action": "fault", "endpoint": "authorize", "status": 503})
    try:
        answers = [
            await system.edr_query(DEMO_AGREEMENT, gateway=g, token=edr, transfer_id=_fresh())
            for g in system.gateways
        ]
        answers += [
            await pull(wire, f"{g}/dps/public", flow.token, transfer_id=_fresh(), show=False)
            for g in system.gateways
        ]
    finally:
        await system.ds_control({"action": "clear_faults"})
    # ds not answering at all: the gateway's connector timeout (5 s) passes first
    await system.ds_control({"action": "fault", "endpoint": "authorize", "status": None, "delay_seconds": 8})
    try:
        answers.append(
            await system.edr_query(
                DEMO_AGREEMENT, gateway=system.gateways[1], token=edr, transfer_id=_fresh()
            )
        )
    finally:
        await system.ds_control({"action": "clear_faults"})
    for r in answers:
        assert r.status_code == 502, r.text
        assert r.json()["error"] == "ds_unavailable" and "items" not in r.json()
    assert {t: await system.end_offset(t) for t in topics} == before
    # and the same token is served again once ds answers: the refusal was ds, not the token
    assert (await system.edr_query(DEMO_AGREEMENT, token=edr)).status_code == 200


async def test_ds_connection_refused_refuses_502_serves_nothing_publishes_nothing(system: System) -> None:
    """ds's address has no listener at all (the double's process is stopped): every connection
    is refused, on the EDR and the DPS pull path of both replicas."""
    wire = Wire(system.http)
    flow = await start_pull_flow(wire, system.info, await control_plane_token(wire, system.info))
    edr = await system.edr_token(DEMO_AGREEMENT)
    topics = (AUDIT_DISCLOSURES, PLAN_REQUESTS)
    before = {t: await system.end_offset(t) for t in topics}
    await asyncio.to_thread(system.stack.stop_double, "ds-connector")
    try:
        with pytest.raises(httpx.ConnectError):  # the premise: nothing listens there any more
            await system.http.get(f"{system.info.ds_url}/_participants")
        answers = [
            await system.edr_query(DEMO_AGREEMENT, gateway=g, token=edr, transfer_id=_fresh())
            for g in system.gateways
        ]
        answers += [
            await pull(wire, f"{g}/dps/public", flow.token, transfer_id=_fresh(), show=False)
            for g in system.gateways
        ]
    finally:
        # the same port and configuration (and EDR key); the policy the tests changed is put back
        await asyncio.to_thread(system.stack.start_double, "ds-connector")
        await system.ds_control({"action": "policy", "policy": system.policy})
    for r in answers:
        assert r.status_code == 502, r.text
        assert r.json()["error"] == "ds_unavailable" and "items" not in r.json()
    # no DisclosureRecorded (nothing was served) and no plan request (nothing was resolved)
    assert {t: await system.end_offset(t) for t in topics} == before
    assert (await system.edr_query(DEMO_AGREEMENT, token=edr)).status_code == 200


async def test_rf02_filter_with_an_unknown_field_is_502(system: System) -> None:
    row_filter = {**SKM, "keys": ["pod:IT001E00000001"], "subject_dids": ["did:web:alice.example"]}
    agreement = await system.add_agreement(_verdict({**row_filter, "row_scope": "all"}))
    before = await system.end_offset(AUDIT_DISCLOSURES)
    r = await system.edr_query(agreement)
    assert r.status_code == 502, r.text
    assert r.json()["error"] == "row_filter_unreadable" and "items" not in r.json()
    assert await system.end_offset(AUDIT_DISCLOSURES) == before


async def test_rf06_unknown_handler_is_403(system: System) -> None:
    agreement = await system.add_agreement(
        _verdict({"handler": "no_such_handler", "args": {"column": "pod"}, "subject_dids": []})
    )
    r = await system.edr_query(agreement)
    assert r.status_code == 403, r.text
    assert r.json()["error"] == "row_filter_unenforceable" and "items" not in r.json()


async def test_rf05_empty_allow_list_serves_no_rows(system: System) -> None:
    agreement = await system.add_agreement(_verdict({**SKM, "keys": [], "subject_dids": []}))
    r = await system.edr_query(agreement, sql="SELECT pod, ts, value FROM meter_readings")
    assert r.status_code == 200, r.text
    assert r.json()["items"] == []
    # a deny puts FALSE into every SELECT: an aggregate reads nothing either, never a real count
    counted = await system.edr_query(agreement, sql="SELECT count(*) AS n FROM meter_readings")
    assert counted.status_code == 200, counted.text
    assert counted.json()["items"] in ([], [{"n": 0}])
