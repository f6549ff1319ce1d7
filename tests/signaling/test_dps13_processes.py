"""DPS-13 with real `signaling` server processes on one database: shared flows, immediate
revocation across processes, serialised signals, restarts, and outbox rows left by a crash."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from dataplane_testing.signaling import (
    FLOWS,
    auth,
    events_for,
    live_grants,
    new_id,
    read_flow_events,
    sql,
    start_message,
    token_of,
)

pytestmark = pytest.mark.e2e


def _jti(token: str) -> str:
    return str(jwt.decode(token, options={"verify_signature": False})["jti"])


async def _flow_grants(db: str, flow: str) -> list[dict[str, Any]]:
    return [g for g in (await live_grants(db)).values() if g["flow_id"] == flow]


async def test_dps13_two_processes_share_flows_tokens_and_revocation(
    base_settings: dict[str, Any],
    flows_db: str,
    spawn_signaling: Any,
    cp_token: Any,
    signing_key: ec.EllipticCurvePrivateKey,
) -> None:
    a, b = await asyncio.gather(spawn_signaling(base_settings), spawn_signaling(base_settings))
    flow = new_id()
    async with httpx.AsyncClient(timeout=10) as http:
        h = auth(cp_token())
        r = await http.post(f"{a.url}{FLOWS}/start", json=start_message(flow), headers=h)
        assert r.status_code == 200, r.text
        first = token_of(r.json())
        grant = (await live_grants(flows_db))[_jti(first)]
        assert (grant["flow_id"], grant["state"], grant["agreement_id"], grant["dataset_id"]) == (
            flow,
            "STARTED",
            "agreement-1",
            "dataset-1",
        )
        assert (grant["participant_id"], grant["counter_party_id"]) == (
            "did:web:provider.example",
            "did:web:consumer.example",
        )
        r = await http.get(f"{b.url}{FLOWS}/{flow}/status", headers=h)
        assert r.json() == {"dataFlowId": flow, "state": "STARTED"}

        # suspended through the other process: gone from the view as soon as the 200 arrived
        r = await http.post(f"{b.url}{FLOWS}/{flow}/suspend", headers=h)
        assert r.status_code == 200
        assert _jti(first) not in await live_grants(flows_db)
        assert await _flow_grants(flows_db, flow) == []

        # two concurrent resumes, one per process: exactly one wins
        results = await asyncio.gather(
            http.post(f"{a.url}{FLOWS}/{flow}/resume", headers=h),
            http.post(f"{b.url}{FLOWS}/{flow}/resume", headers=h),
        )
        assert sorted(r.status_code for r in results) == [200, 409]
        resumed = token_of(next(r for r in results if r.status_code == 200).json())
        assert [g["token_id"] for g in await _flow_grants(flows_db, flow)] == [_jti(resumed)]

        # two concurrent starts of one id, one per process: one 409
        other = new_id()
        results = await asyncio.gather(
            http.post(f"{a.url}{FLOWS}/start", json=start_message(other), headers=h),
            http.post(f"{b.url}{FLOWS}/start", json=start_message(other), headers=h),
        )
        assert sorted(r.status_code for r in results) == [200, 409]
        assert next(r for r in results if r.status_code == 409).json()["error"] == "flow_exists"

        # a restart keeps flows and the live token
        a.stop()
        b.stop()
        a2 = await spawn_signaling(base_settings)
        r = await http.get(f"{a2.url}{FLOWS}/{flow}/status", headers=h)
        assert r.json() == {"dataFlowId": flow, "state": "STARTED"}
        assert [g["token_id"] for g in await _flow_grants(flows_db, flow)] == [_jti(resumed)]
        jwt.decode(
            resumed, signing_key.public_key(), algorithms=["ES256"], audience="did:web:consumer.example"
        )
        r = await http.post(f"{a2.url}{FLOWS}/{flow}/terminate", headers=h)
        assert r.status_code == 200
        assert await _flow_grants(flows_db, flow) == []


async def test_outbox_rows_of_a_killed_process_are_published_by_the_next(
    base_settings: dict[str, Any], flows_db: str, spawn_signaling: Any, cp_token: Any
) -> None:
    writer = await spawn_signaling({**base_settings, "outbox_relay_enabled": False})
    flow = new_id()
    async with httpx.AsyncClient(timeout=10) as http:
        h = auth(cp_token())
        assert (
            await http.post(f"{writer.url}{FLOWS}/start", json=start_message(flow), headers=h)
        ).status_code == 200
        assert (await http.post(f"{writer.url}{FLOWS}/{flow}/suspend", headers=h)).status_code == 200
    unsent = "SELECT count(*) AS n FROM dps_outbox WHERE sent_at IS NULL AND key=$1"
    assert (await sql(flows_db, unsent, flow))[0]["n"] == 2
    writer.kill()
    assert (await sql(flows_db, unsent, flow))[0]["n"] == 2

    await spawn_signaling(base_settings)  # relay on
    records = await read_flow_events(
        base_settings["kafka_bootstrap_servers"], lambda rs: len(events_for(rs, flow)) >= 2
    )
    assert [(e["signal"], e["state"]) for e in events_for(records, flow)] == [
        ("start", "STARTED"),
        ("suspend", "SUSPENDED"),
    ]
    for _ in range(50):  # the relay marks rows sent right after the broker acknowledged them
        if (await sql(flows_db, unsent, flow))[0]["n"] == 0:
            break
        await asyncio.sleep(0.1)
    assert (await sql(flows_db, unsent, flow))[0]["n"] == 0
