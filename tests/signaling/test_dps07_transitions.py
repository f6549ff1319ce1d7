"""DPS-07 — transitions, token retirement, and 404 for unknown or foreign flows."""

from __future__ import annotations

import json
from typing import Any

import jwt
import pytest

from dataplane_testing.signaling import (
    FLOWS,
    OTHER_CP,
    auth,
    consumer_address,
    live_grants,
    new_id,
    sql,
    start_message,
    token_of,
)


def _db(app: Any) -> str:
    return str(app.settings.database_url).replace("+asyncpg", "")


def _jti(token: str) -> str:
    return str(jwt.decode(token, options={"verify_signature": False})["jti"])


async def _signal(
    app: Any, cp_token: Any, flow: str, signal: str, body: Any = None, client: str | None = None
) -> Any:
    headers = auth(cp_token(client) if client else cp_token())
    return await app.client.post(f"{FLOWS}/{flow}/{signal}", json=body, headers=headers)


async def _started(app: Any, cp_token: Any) -> tuple[str, str]:
    flow = new_id()
    r = await app.client.post(f"{FLOWS}/start", json=start_message(flow), headers=auth(cp_token()))
    assert r.status_code == 200
    return flow, token_of(r.json())


async def _state(app: Any, cp_token: Any, flow: str) -> str:
    r = await app.client.get(f"{FLOWS}/{flow}/status", headers=auth(cp_token()))
    return str(r.json()["state"])


async def test_dps07_suspend_resume_issues_a_new_token_and_the_old_stays_dead(
    signaling: Any, cp_token: Any
) -> None:
    flow, old = await _started(signaling, cp_token)
    assert _jti(old) in await live_grants(_db(signaling))
    r = await _signal(signaling, cp_token, flow, "suspend", {"reason": "pause"})
    assert r.status_code == 200
    assert await _state(signaling, cp_token, flow) == "SUSPENDED"
    assert not [g for g in (await live_grants(_db(signaling))).values() if g["flow_id"] == flow]
    # the address in a resume message is ignored on a provider flow
    r = await _signal(signaling, cp_token, flow, "resume", {"dataAddress": consumer_address("ignored")})
    assert r.status_code == 200
    body = r.json()
    assert body["state"] == "STARTED" and body["dataFlowId"] == flow
    new = token_of(body)
    assert new != old and body["dataAddress"]["endpoint"] == "https://gateway.example/dps/public"
    grants = await live_grants(_db(signaling))
    assert _jti(new) in grants and _jti(old) not in grants
    assert grants[_jti(new)]["state"] == "STARTED"


async def test_dps07_resume_of_a_running_flow_conflicts(signaling: Any, cp_token: Any) -> None:
    flow, token = await _started(signaling, cp_token)
    r = await _signal(signaling, cp_token, flow, "resume")
    assert r.status_code == 409
    assert r.json()["error"] == "invalid_transition"
    assert _jti(token) in await live_grants(_db(signaling))


async def test_dps07_terminate_retires_the_token_and_is_idempotent(signaling: Any, cp_token: Any) -> None:
    flow, token = await _started(signaling, cp_token)
    assert (await _signal(signaling, cp_token, flow, "terminate", {"reason": "done"})).status_code == 200
    assert _jti(token) not in await live_grants(_db(signaling))
    assert (await _signal(signaling, cp_token, flow, "terminate")).status_code == 200
    assert await _state(signaling, cp_token, flow) == "TERMINATED"
    for signal in ("suspend", "resume", "completed"):
        assert (await _signal(signaling, cp_token, flow, signal)).status_code == 409


async def test_dps07_completed_retires_the_token_and_is_final(signaling: Any, cp_token: Any) -> None:
    flow, token = await _started(signaling, cp_token)
    assert (await _signal(signaling, cp_token, flow, "completed", {})).status_code == 200
    assert _jti(token) not in await live_grants(_db(signaling))
    assert await _state(signaling, cp_token, flow) == "COMPLETED"
    for signal in ("terminate", "resume", "suspend", "completed"):
        r = await _signal(signaling, cp_token, flow, signal)
        assert r.status_code == 409, signal
        assert r.json()["error"] == "invalid_transition"


async def test_dps07_other_transitions_conflict(signaling: Any, cp_token: Any) -> None:
    prepared = new_id()
    await signaling.client.post(f"{FLOWS}/prepare", json=start_message(prepared), headers=auth(cp_token()))
    for signal in ("suspend", "resume", "completed"):
        assert (await _signal(signaling, cp_token, prepared, signal)).status_code == 409
    flow, _ = await _started(signaling, cp_token)
    await _signal(signaling, cp_token, flow, "suspend")
    assert (await _signal(signaling, cp_token, flow, "suspend")).status_code == 409
    assert (await _signal(signaling, cp_token, flow, "completed")).status_code == 409


async def test_dps07_prepare_then_started_records_the_providers_address_without_its_credential(
    signaling: Any, cp_token: Any
) -> None:
    flow = new_id()
    await signaling.client.post(f"{FLOWS}/prepare", json=start_message(flow), headers=auth(cp_token()))
    r = await _signal(
        signaling, cp_token, flow, "started", {"dataAddress": consumer_address("provider-secret")}
    )
    assert r.status_code == 200
    assert await _state(signaling, cp_token, flow) == "STARTED"
    rows = await sql(
        _db(signaling), "SELECT data_address::text AS a, token_id FROM dps_data_flows WHERE id=$1", flow
    )
    stored = json.loads(rows[0]["a"])
    assert stored["endpoint"] == "https://provider.example/dps/public"
    assert "provider-secret" not in rows[0]["a"]
    assert [p["name"] for p in stored["endpointProperties"]] == ["https://w3id.org/edc/v0.0.1/ns/authType"]
    assert rows[0]["token_id"] is None  # a consumer flow holds no token of ours
    # a consumer flow's resume records the new address, again without its credential
    await _signal(signaling, cp_token, flow, "suspend")
    r = await _signal(signaling, cp_token, flow, "resume", {"dataAddress": consumer_address("second-secret")})
    assert r.status_code == 200 and "dataAddress" not in r.json()
    rows = await sql(_db(signaling), "SELECT data_address::text AS a FROM dps_data_flows WHERE id=$1", flow)
    assert "second-secret" not in rows[0]["a"]


async def test_dps07_started_without_an_address_is_refused(signaling: Any, cp_token: Any) -> None:
    flow = new_id()
    await signaling.client.post(f"{FLOWS}/prepare", json=start_message(flow), headers=auth(cp_token()))
    for body in (None, {}, {"dataAddress": None}):
        r = await _signal(signaling, cp_token, flow, "started", body)
        assert r.status_code == 400
        assert r.json()["error"] == "data_address_required"
    assert await _state(signaling, cp_token, flow) == "PREPARED"


async def test_dps07_started_is_not_a_provider_signal(signaling: Any, cp_token: Any) -> None:
    flow, _ = await _started(signaling, cp_token)
    r = await _signal(signaling, cp_token, flow, "started", {"dataAddress": consumer_address()})
    assert r.status_code == 409
    assert r.json()["error"] == "invalid_transition"


@pytest.mark.parametrize("signal", ["started", "suspend", "resume", "terminate", "completed"])
async def test_dps07_an_unknown_flow_is_404(signaling: Any, cp_token: Any, signal: str) -> None:
    r = await _signal(signaling, cp_token, "no-such-flow", signal, {"dataAddress": consumer_address()})
    assert r.status_code == 404
    assert r.json() == {
        "type": "urn:dataplane:error:flow_not_found",
        "title": "Flow not found",
        "status": 404,
        "error": "flow_not_found",
        "detail": "no such data flow",
    }


async def test_dps07_another_callers_flow_reads_as_absent(signaling: Any, cp_token: Any) -> None:
    flow, token = await _started(signaling, cp_token)
    for signal in ("suspend", "resume", "terminate", "completed", "started"):
        r = await _signal(signaling, cp_token, flow, signal, client=OTHER_CP)
        assert r.status_code == 404
        assert r.json()["error"] == "flow_not_found"
    r = await signaling.client.get(f"{FLOWS}/{flow}/status", headers=auth(cp_token(OTHER_CP)))
    assert r.status_code == 404
    assert _jti(token) in await live_grants(_db(signaling))
