"""DPS-05 — start: the provider side of a pull."""

from __future__ import annotations

from typing import Any

from dataplane_testing.signaling import FLOWS, auth, new_id, start_message, token_of

EDC = "https://w3id.org/edc/v0.0.1/ns/"


async def test_dps05_start_answers_started_with_the_pull_address(signaling: Any, cp_token: Any) -> None:
    flow = new_id()
    r = await signaling.client.post(f"{FLOWS}/start", json=start_message(flow), headers=auth(cp_token()))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["dataFlowId"] == flow and body["state"] == "STARTED"
    assert body["messageId"]
    address = body["dataAddress"]
    assert address["@type"] == "DataAddress"
    assert address["endpointType"] == "https://w3id.org/idsa/v4.1/HTTP"
    assert address["endpoint"] == "https://gateway.example/dps/public"
    props = {p["name"]: p["value"] for p in address["endpointProperties"]}
    assert props[EDC + "endpoint"] == "https://gateway.example/dps/public"
    assert props[EDC + "endpointType"] == "https://w3id.org/idsa/v4.1/HTTP"
    assert props[EDC + "authType"] == "bearer"
    assert props[EDC + "authorization"] == token_of(body)
    assert all(p["@type"] == "EndpointProperty" for p in address["endpointProperties"])


async def test_dps05_start_twice_conflicts(signaling: Any, cp_token: Any) -> None:
    flow = new_id()
    first = await signaling.client.post(f"{FLOWS}/start", json=start_message(flow), headers=auth(cp_token()))
    again = await signaling.client.post(f"{FLOWS}/start", json=start_message(flow), headers=auth(cp_token()))
    assert first.status_code == 200
    assert again.status_code == 409
    assert again.json()["error"] == "flow_exists"


async def test_dps05_start_with_an_unsupported_type_is_refused_and_creates_nothing(
    signaling: Any, cp_token: Any
) -> None:
    flow = new_id()
    msg = start_message(flow, transferType="HttpData-PUSH")
    r = await signaling.client.post(f"{FLOWS}/start", json=msg, headers=auth(cp_token()))
    assert r.status_code == 400
    assert r.json()["error"] == "unsupported_transfer_type"
    status = await signaling.client.get(f"{FLOWS}/{flow}/status", headers=auth(cp_token()))
    assert status.status_code == 404


async def test_dps05_a_pull_start_with_a_data_address_is_refused(signaling: Any, cp_token: Any) -> None:
    flow = new_id()
    msg = start_message(flow, dataAddress={"@type": "DataAddress", "endpoint": "https://x"})
    r = await signaling.client.post(f"{FLOWS}/start", json=msg, headers=auth(cp_token()))
    assert r.status_code == 400
    assert r.json()["error"] == "data_address_not_allowed"
    status = await signaling.client.get(f"{FLOWS}/{flow}/status", headers=auth(cp_token()))
    assert status.status_code == 404
