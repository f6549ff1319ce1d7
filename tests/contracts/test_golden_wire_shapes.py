"""Golden JSON samples pin every wire shape not pinned elsewhere: a change to one of these files
is a change to a contract another process or another organisation reads."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from dataplane_contracts.dps import (
    DataFlowStatusMessage,
    DataPlaneRegistrationMessage,
    FlowStateChanged,
    PullTokenClaims,
    pull_data_address,
)
from dataplane_contracts.ds import AuthorizeRequest, DataplaneRowFilter, DecisionEnvelope
from dataplane_contracts.plans import CallerIdentity, ClaimCheck, Plan

GOLDEN = Path(__file__).parent / "golden"
AT = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
EVENT = {"event_id": "00000000-0000-4000-8000-000000000002", "occurred_at": AT, "schema_version": 1}


def _shapes() -> dict[str, Any]:
    return {
        "authorize_request": AuthorizeRequest(
            consumer_did="did:web:consumer.example",
            agreement_id="agr-1",
            transfer_id=None,
            purpose=["research"],
            dataset_ids=["meter_readings"],
        ).model_dump(mode="json"),
        "decision_envelope": DecisionEnvelope.model_validate(
            {
                "decision": "allow",
                "datasets": [{"dataset_id": "meter_readings", "decision": "allow", "row_filter": None}],
                "cache": {"ttl_seconds": 60},
                "decision_ref": "e" * 64,
            }
        ).model_dump(mode="json"),
        "row_filter": DataplaneRowFilter(
            handler="subject_key_match",
            args={"column": "pod", "key_type": "pod"},
            keys=["pod:IT001"],
            subject_dids=["did:web:alice.example"],
        ).model_dump(mode="json"),
        "plan_in": Plan.among("pod", ["IT001", "IT002"], key_type="pod", label="pod keys").model_dump(
            mode="json"
        ),
        "claim_check": ClaimCheck(
            handler="rec_registry",
            args={"column": "sensor_id"},
            table="public.readings",
            caller=CallerIdentity(sub="s", username="u", token="t", token_exp=1),
            principals=None,
        ).model_dump(mode="json"),
        "dps_status_with_address": DataFlowStatusMessage(
            messageId="m-1",
            dataFlowId="flow-1",
            state="STARTED",
            dataAddress=pull_data_address("https://dp.example", "TOKEN"),
        ).wire(),
        "dps_registration": DataPlaneRegistrationMessage(
            dataplaneId="dataplane",
            endpoint="https://dp.example/dps/v1/dataflows",
            transferTypes=["HttpData-PULL"],
            labels=[],
        ).model_dump(mode="json", by_alias=True),
        "flow_state_changed": FlowStateChanged.model_validate(
            {
                **EVENT,
                "flow_id": "flow-1",
                "signal": "suspend",
                "role": "PROVIDER",
                "previous_state": "STARTED",
                "state": "SUSPENDED",
                "agreement_id": "agr-1",
                "dataset_id": "meter_readings",
                "participant_id": "did:web:provider.example",
                "counter_party_id": "did:web:consumer.example",
                "transfer_type": "HttpData-PULL",
            }
        ).model_dump(mode="json"),
        "pull_token_claims": PullTokenClaims.model_validate(
            {
                "jti": "5b0c2f0e-9a1d-4c3e-8f7a-2d6b1e4c9a00",
                "iss": "did:web:provider.example",
                "sub": "did:web:provider.example",
                "aud": ["did:web:consumer.example"],  # a one-element list reads as the audience
                "iat": 1_800_000_000,
            }
        ).model_dump(mode="json"),
    }


@pytest.mark.parametrize("name", sorted(_shapes()))
def test_golden_wire_shape(name: str) -> None:
    actual = json.loads(json.dumps(_shapes()[name]))
    path = GOLDEN / f"{name}.json"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(json.dumps(actual, indent=2, sort_keys=True) + "\n")
    assert actual == json.loads(path.read_text())
