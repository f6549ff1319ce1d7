"""DPS-04 — prepare: the consumer side of a pull."""

from __future__ import annotations

from typing import Any

from dataplane_testing.signaling import FLOWS, auth, new_id, start_message


async def test_dps04_prepare_creates_a_prepared_flow_without_an_address(
    signaling: Any, cp_token: Any
) -> None:
    flow = new_id()
    r = await signaling.client.post(f"{FLOWS}/prepare", json=start_message(flow), headers=auth(cp_token()))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["dataFlowId"] == flow and body["state"] == "PREPARED"
    assert "dataAddress" not in body and "error" not in body
    status = await signaling.client.get(f"{FLOWS}/{flow}/status", headers=auth(cp_token()))
    assert status.json() == {"dataFlowId": flow, "state": "PREPARED"}


async def test_dps04_prepare_with_an_unsupported_type_is_refused(signaling: Any, cp_token: Any) -> None:
    flow = new_id()
    msg = start_message(flow, transferType="HttpData-PUSH")
    r = await signaling.client.post(f"{FLOWS}/prepare", json=msg, headers=auth(cp_token()))
    assert r.status_code == 400
    assert r.json()["error"] == "unsupported_transfer_type"
    assert (await signaling.client.get(f"{FLOWS}/{flow}/status", headers=auth(cp_token()))).status_code == 404


async def test_dps04_an_existing_flow_id_conflicts(signaling: Any, cp_token: Any) -> None:
    flow = new_id()
    assert (
        await signaling.client.post(f"{FLOWS}/start", json=start_message(flow), headers=auth(cp_token()))
    ).status_code == 200
    r = await signaling.client.post(f"{FLOWS}/prepare", json=start_message(flow), headers=auth(cp_token()))
    assert r.status_code == 409
    assert r.json()["error"] == "flow_exists"
