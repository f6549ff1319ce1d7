"""DPS-03 messages, DPS-06 claims, the state machine and the flow event as contracts."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from dataplane_contracts.dps import (
    ALLOWED_TRANSITIONS,
    PULL_GRANT_COLUMNS,
    PULL_GRANT_VIEW,
    DataAddress,
    DataFlowStartMessage,
    DataFlowStatusMessage,
    FlowState,
    FlowStateChanged,
    PullTokenClaims,
    can_transition,
    is_pull_transfer,
    pull_data_address,
)

EDC = "https://w3id.org/edc/v0.0.1/ns/"


def rc2(**over: Any) -> dict[str, Any]:
    msg: dict[str, Any] = {
        "messageId": "m1",
        "participantId": "did:web:p",
        "counterPartyId": "did:web:c",
        "dataspaceContext": None,
        "processId": "f1",
        "agreementId": "a1",
        "datasetId": "d1",
        "transferType": "HttpData-PULL",
        "callbackAddress": None,
        "claims": None,
        "labels": None,
        "metadata": None,
        "dataAddress": None,
    }
    msg.update(over)
    return {k: v for k, v in msg.items() if v is not ...}


def test_dps03_edc_0_18_rc2_names_are_read_with_nulls() -> None:
    m = DataFlowStartMessage.model_validate(rc2())
    assert (m.flow_id, m.transfer_type, m.participant_id, m.counter_party_id) == (
        "f1",
        "HttpData-PULL",
        "did:web:p",
        "did:web:c",
    )
    assert m.claims == {} and m.labels == [] and m.metadata == {} and m.callback_address is None


def test_dps03_rc3_rc4_names_are_read() -> None:
    m = DataFlowStartMessage.model_validate(
        rc2(
            processId=...,
            transferType=...,
            dataFlowId="f2",
            profile="https://w3id.org/dspace-sig/profile/http-pull",
        )
    )
    assert m.flow_id == "f2"
    assert m.transfer_type.endswith("http-pull")


def test_dps03_unknown_fields_are_ignored() -> None:
    m = DataFlowStartMessage.model_validate(rc2(somethingNew={"x": 1}, **{"@context": ["x"]}))
    assert m.flow_id == "f1"


@pytest.mark.parametrize(
    "missing", ["processId", "participantId", "counterPartyId", "agreementId", "datasetId", "transferType"]
)
def test_dps03_a_deciding_fact_is_required(missing: str) -> None:
    with pytest.raises(ValidationError):
        DataFlowStartMessage.model_validate(rc2(**{missing: ...}))
    with pytest.raises(ValidationError):
        DataFlowStartMessage.model_validate(rc2(**{missing: ""}))


def test_dps03_a_dsp_data_address_round_trips_as_edc_serialises_it() -> None:
    wire = {
        "@type": "DataAddress",
        "endpointType": "https://w3id.org/idsa/v4.1/HTTP",
        "endpoint": "https://p/dps/public",
        "endpointProperties": [
            {"@type": "EndpointProperty", "name": EDC + "authorization", "value": "tok"},
            {"@type": "EndpointProperty", "name": EDC + "authType", "value": "bearer"},
        ],
    }
    assert DataAddress.model_validate(wire).wire() == wire
    untyped = DataAddress.model_validate({"endpoint": "e", "endpointProperties": [{"name": "n", "value": 1}]})
    assert untyped.property("n") == "1"


def test_dps03_stored_addresses_lose_their_credentials() -> None:
    a = DataAddress.model_validate(
        {
            "endpoint": "e",
            "endpointProperties": [
                {"name": EDC + "authorization", "value": "secret"},
                {"name": "authorization", "value": "secret"},
                {"name": "tx-auth:refreshToken", "value": "secret"},
                {"name": EDC + "authType", "value": "bearer"},
            ],
        }
    )
    stripped = a.without_credentials()
    assert "secret" not in str(stripped.wire())
    assert stripped.property("authType") == "bearer"


def test_dps05_the_pull_address_carries_edc_named_properties() -> None:
    a = pull_data_address("https://gw.example/", "T")
    assert a.endpoint == "https://gw.example/dps/public"
    assert a.endpoint_type == "https://w3id.org/idsa/v4.1/HTTP"
    props = {p.name: p.value for p in a.endpoint_properties}
    assert props == {
        EDC + "endpoint": "https://gw.example/dps/public",
        EDC + "endpointType": "https://w3id.org/idsa/v4.1/HTTP",
        EDC + "authorization": "T",
        EDC + "authType": "bearer",
    }


def test_dps03_a_status_message_always_has_a_state() -> None:
    wire = DataFlowStatusMessage(data_flow_id="f", state=FlowState.PREPARED).wire()
    assert set(wire) == {"messageId", "dataFlowId", "state"}
    assert wire["state"] == "PREPARED"
    with pytest.raises(ValidationError):
        DataFlowStatusMessage.model_validate({"dataFlowId": "f"})


@pytest.mark.parametrize(
    ("transfer_type", "pull"),
    [
        ("HttpData-PULL", True),
        ("HttpData-PULL-HttpData", True),
        ("https://w3id.org/dspace-sig/profile/http-pull", True),
        ("Http_Data_pull", True),
        ("HttpData-PUSH", False),
        ("https://w3id.org/dspace-sig/profile/http-push", False),
        ("pullover", False),
    ],
)
def test_dps03_pull_is_recognised_in_both_spellings(transfer_type: str, pull: bool) -> None:
    assert is_pull_transfer(transfer_type) is pull


def test_dps06_pull_token_claims() -> None:
    c = PullTokenClaims.model_validate({"jti": "j", "iss": "p", "sub": "p", "aud": ["c"], "iat": 1})
    assert c.aud == "c"
    with pytest.raises(ValidationError):
        PullTokenClaims.model_validate({"jti": "j", "iss": "p", "sub": "q", "aud": "c", "iat": 1})
    with pytest.raises(ValidationError):
        PullTokenClaims.model_validate({"iss": "p", "sub": "p", "aud": "c", "iat": 1})
    with pytest.raises(ValidationError):
        PullTokenClaims.model_validate({"jti": "j", "iss": "p", "sub": "p", "aud": ["c", "d"], "iat": 1})
    assert "exp" not in PullTokenClaims.model_fields


S = FlowState


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (S.PREPARED, S.STARTED),
        (S.STARTED, S.SUSPENDED),
        (S.SUSPENDED, S.STARTED),
        (S.STARTED, S.COMPLETED),
        (S.PREPARED, S.TERMINATED),
        (S.STARTED, S.TERMINATED),
        (S.SUSPENDED, S.TERMINATED),
    ],
)
def test_dps07_spec_transitions_are_allowed(a: FlowState, b: FlowState) -> None:
    assert can_transition(a, b)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (S.PREPARED, S.SUSPENDED),
        (S.SUSPENDED, S.COMPLETED),
        (S.STARTED, S.PREPARED),
        (S.COMPLETED, S.STARTED),
        (S.COMPLETED, S.TERMINATED),
        (S.TERMINATED, S.STARTED),
        (S.STARTED, S.STARTED),
    ],
)
def test_dps07_other_transitions_conflict(a: FlowState, b: FlowState) -> None:
    assert not can_transition(a, b)


def test_dps07_final_states_have_no_way_out() -> None:
    assert ALLOWED_TRANSITIONS[S.COMPLETED] == frozenset() == ALLOWED_TRANSITIONS[S.TERMINATED]


def test_dps13_the_pull_grant_view_contract() -> None:
    assert PULL_GRANT_VIEW == "dps_pull_grants"
    assert PULL_GRANT_COLUMNS == (
        "token_id",
        "flow_id",
        "state",
        "agreement_id",
        "dataset_id",
        "participant_id",
        "counter_party_id",
        "grant_extensions",  # the frozen client range filters (docs/records.md)
    )


def test_flow_event_has_no_slot_for_a_token() -> None:
    fields = set(FlowStateChanged.model_fields)
    assert not {f for f in fields if "token" in f}
    base = {
        "flow_id": "f",
        "signal": "start",
        "role": "PROVIDER",
        "previous_state": None,
        "state": "STARTED",
        "agreement_id": "a",
        "dataset_id": "d",
        "participant_id": "p",
        "counter_party_id": "c",
        "transfer_type": "HttpData-PULL",
    }
    event = FlowStateChanged.model_validate(base)
    assert FlowStateChanged.model_validate_json(event.model_dump_json()) == event
    with pytest.raises(ValidationError):
        FlowStateChanged.model_validate({**base, "token": "x"})
