"""DPS-03 — messages in either spec spelling, over HTTP: the flow id from `dataFlowId` or
`processId`, the transfer type from `profile` or `transferType`; each deciding fact required (422
`invalid_message`, nothing created); unknown fields ignored. The models themselves are tested in
tests/contracts/test_dps03_messages.py; here the routes are held to them."""

from __future__ import annotations

from typing import Any

import pytest

from dataplane_testing.signaling import FLOWS, auth, new_id, start_message

SIGNALS = ["prepare", "start"]
STATE = {"prepare": "PREPARED", "start": "STARTED"}
# each fact and the keys it may be spelled with; missing means none of them carries a value
FACTS = {
    "flow id": ("processId", "dataFlowId"),
    "participantId": ("participantId",),
    "counterPartyId": ("counterPartyId",),
    "agreementId": ("agreementId",),
    "datasetId": ("datasetId",),
    "transfer type": ("transferType", "profile"),
}


def _spelled(flow: str, id_key: str, type_key: str, **extra: Any) -> dict[str, Any]:
    msg = start_message(flow, processId=..., transferType=..., **extra)
    return {**msg, id_key: flow, type_key: "HttpData-PULL"}


@pytest.mark.parametrize("signal", SIGNALS)
@pytest.mark.parametrize("id_key", ["processId", "dataFlowId"])
@pytest.mark.parametrize("type_key", ["transferType", "profile"])
async def test_dps03_either_spelling_is_read(
    signaling: Any, cp_token: Any, signal: str, id_key: str, type_key: str
) -> None:
    flow = new_id()
    msg = _spelled(flow, id_key, type_key)
    r = await signaling.client.post(f"{FLOWS}/{signal}", json=msg, headers=auth(cp_token()))
    assert r.status_code == 200, r.text
    assert r.json()["dataFlowId"] == flow and r.json()["state"] == STATE[signal]
    status = await signaling.client.get(f"{FLOWS}/{flow}/status", headers=auth(cp_token()))
    assert status.json() == {"dataFlowId": flow, "state": STATE[signal]}


@pytest.mark.parametrize("signal", SIGNALS)
@pytest.mark.parametrize("type_key", ["transferType", "profile"])
async def test_dps03_the_transfer_type_is_decided_in_either_spelling(
    signaling: Any, cp_token: Any, signal: str, type_key: str
) -> None:
    """The value read is the one decided on: a push type is refused whichever key carries it."""
    flow = new_id()
    msg = {**_spelled(flow, "processId", type_key), type_key: "HttpData-PUSH"}
    r = await signaling.client.post(f"{FLOWS}/{signal}", json=msg, headers=auth(cp_token()))
    assert r.status_code == 400
    assert r.json()["error"] == "unsupported_transfer_type"


@pytest.mark.parametrize("signal", SIGNALS)
@pytest.mark.parametrize("fact", FACTS)
async def test_dps03_a_message_missing_a_deciding_fact_is_422(
    signaling: Any, cp_token: Any, signal: str, fact: str
) -> None:
    flow = new_id()
    for missing in (..., None, ""):  # absent, null, empty: none of them is the fact
        msg = start_message(flow, **dict.fromkeys(FACTS[fact], missing))
        r = await signaling.client.post(f"{FLOWS}/{signal}", json=msg, headers=auth(cp_token()))
        assert r.status_code == 422, (fact, missing, r.text)
        assert r.json()["error"] == "invalid_message"
    # nothing was created under the id the message did carry
    status = await signaling.client.get(f"{FLOWS}/{flow}/status", headers=auth(cp_token()))
    assert status.status_code == 404


UNKNOWN = {
    "futureField": {"a": 1},
    "@context": ["https://w3id.org/dspace/2025/1/context.jsonld"],
    "@type": "DataFlowStartMessage",
    "x-vendor": "y",
}


@pytest.mark.parametrize("signal", SIGNALS)
async def test_dps03_unknown_fields_are_ignored(signaling: Any, cp_token: Any, signal: str) -> None:
    flow = new_id()
    msg = start_message(flow, labels=None, metadata=None, **UNKNOWN)
    r = await signaling.client.post(f"{FLOWS}/{signal}", json=msg, headers=auth(cp_token()))
    assert r.status_code == 200, r.text
    assert not set(UNKNOWN) & set(r.json())


async def test_dps03_unknown_fields_are_ignored_in_transition_messages(signaling: Any, cp_token: Any) -> None:
    flow = new_id()
    r = await signaling.client.post(f"{FLOWS}/start", json=start_message(flow), headers=auth(cp_token()))
    assert r.status_code == 200
    for signal in ("suspend", "resume", "terminate"):
        body = {"messageId": new_id(), "reason": "operator", **UNKNOWN}
        r = await signaling.client.post(f"{FLOWS}/{flow}/{signal}", json=body, headers=auth(cp_token()))
        assert r.status_code == 200, (signal, r.text)
