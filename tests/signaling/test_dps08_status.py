"""DPS-08 — status."""

from __future__ import annotations

from typing import Any

from dataplane_testing.signaling import FLOWS, auth, new_id, start_message


async def test_dps08_status_answers_id_and_state(signaling: Any, cp_token: Any) -> None:
    flow = new_id()
    await signaling.client.post(f"{FLOWS}/start", json=start_message(flow), headers=auth(cp_token()))
    r = await signaling.client.get(f"{FLOWS}/{flow}/status", headers=auth(cp_token()))
    assert r.status_code == 200
    assert r.json() == {"dataFlowId": flow, "state": "STARTED"}
    await signaling.client.post(f"{FLOWS}/{flow}/suspend", headers=auth(cp_token()))
    r = await signaling.client.get(f"{FLOWS}/{flow}/status", headers=auth(cp_token()))
    assert r.json() == {"dataFlowId": flow, "state": "SUSPENDED"}


async def test_dps08_status_of_an_unknown_flow_is_404(signaling: Any, cp_token: Any) -> None:
    r = await signaling.client.get(f"{FLOWS}/nope/status", headers=auth(cp_token()))
    assert r.status_code == 404
    assert r.json()["error"] == "flow_not_found"


async def test_dps08_status_requires_an_admitted_caller(signaling: Any) -> None:
    r = await signaling.client.get(f"{FLOWS}/nope/status")
    assert r.status_code == 401
