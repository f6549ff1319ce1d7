"""RF-07, RF-08: no contracts model's repr()/str() — nor the text of a ValidationError raised by one —
carries a key, a principal or a token. These are what ends in a log line or a traceback."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

import dataplane_contracts
from dataplane_contracts.dps import (
    ControlPlaneRegistrationMessage,
    DataFlowStartMessage,
    DataFlowStatusMessage,
    PullTokenClaims,
    pull_data_address,
)
from dataplane_contracts.ds import DataplaneRowFilter, DatasetVerdict, DecisionEnvelope
from dataplane_contracts.plans import CallerIdentity, ClaimCheck, Plan, PlanKeyInputs
from dataplane_contracts.settings import PlanCacheSettings

PRINCIPAL = "alice@x.org"
KEY = "pod:IT001E00000042"
KEY_VALUE = "IT001E00000042"
TOKEN = "eyJhbGciOiJFUzI1NiJ9.secret-token-body.sig"
JTI = "jti-7f3a9c0e55d14b2f"
SECRETS = (PRINCIPAL, KEY, KEY_VALUE, TOKEN, JTI)

RAW_FILTER = {
    "handler": "subject_key_match",
    "args": {"column": "pod", "key_type": "pod"},
    "principals": [PRINCIPAL],
    "keys": [KEY],
    "subject_dids": ["did:web:alice.example"],
}
START = {
    "processId": "flow-1",
    "participantId": "did:web:provider.example",
    "counterPartyId": "did:web:consumer.example",
    "agreementId": "agr-1",
    "datasetId": "meter_readings",
    "transferType": "HttpData-PULL",
    "claims": {"token": TOKEN},
    "dataAddress": pull_data_address("https://dp.example", TOKEN).wire(),
}


def _renderings(model: BaseModel) -> list[str]:
    # repr and str, and what rich/devtools print (they read __repr_args__, not __repr__)
    return [repr(model), str(model), f"{model}", f"{model!r}", repr(list(model.__repr_args__()))]


def _models() -> dict[str, BaseModel]:
    envelope = DecisionEnvelope.model_validate(
        {
            "decision": "allow",
            "datasets": [{"dataset_id": "d", "decision": "allow", "row_filter": RAW_FILTER}],
        }
    )
    caller = CallerIdentity(sub=PRINCIPAL, username=PRINCIPAL, email=PRINCIPAL, token=TOKEN)
    return {
        "decision_envelope": envelope,
        "dataset_verdict": envelope.datasets[0],
        "dataset_verdict_malformed_filter": DatasetVerdict.model_validate(
            {"dataset_id": "d", "row_filter": {"handler": "h", "bogus": [PRINCIPAL, KEY]}}
        ),
        "row_filter": DataplaneRowFilter.model_validate(RAW_FILTER),
        "plan": Plan.among("pod", [KEY_VALUE], key_type="pod"),
        "plan_key_inputs": PlanKeyInputs(
            handler="h", table="t", caller=PRINCIPAL, principals=(PRINCIPAL,), keys=(KEY,), args={"k": KEY}
        ),
        "caller_identity": caller,
        "claim_check": ClaimCheck(
            handler="h",
            table="t",
            caller=caller,
            principals=(PRINCIPAL,),
            keys=(KEY,),
            request_context={"authorization": TOKEN},
        ),
        "dps_start": DataFlowStartMessage.model_validate(START),
        "dps_status": DataFlowStatusMessage.model_validate(
            {"dataFlowId": "flow-1", "state": "STARTED", "dataAddress": START["dataAddress"]}
        ),
        "control_plane_registration": ControlPlaneRegistrationMessage.model_validate(
            {"controlplaneId": "cp", "endpoint": "https://cp.example", "authorization": {"token": TOKEN}}
        ),
        "pull_token_claims": PullTokenClaims(
            jti=JTI, iss="did:web:p.example", sub="did:web:p.example", aud="did:web:c.example", iat=1
        ),
    }


@pytest.mark.parametrize("name", sorted(_models()))
def test_rf08_repr_and_str_carry_no_key_principal_or_token(name: str) -> None:
    for text in _renderings(_models()[name]):
        for secret in SECRETS:
            assert secret not in text, (name, text)


def test_rf08_envelope_repr_still_says_which_datasets_it_holds() -> None:
    # the redaction removes the values, not the envelope's own facts
    text = repr(_models()["decision_envelope"])
    assert "dataset_id='d'" in text and "decision='allow'" in text


def _invalid() -> dict[str, Callable[[], Any]]:
    return {
        "row_filter_non_did_subject": lambda: DataplaneRowFilter.model_validate(
            {"handler": "h", "subject_dids": [PRINCIPAL]}
        ),
        "row_filter_keys_not_a_list": lambda: DataplaneRowFilter.model_validate(
            {"handler": "h", "keys": KEY}
        ),
        "row_filter_principals_not_a_list": lambda: DataplaneRowFilter.model_validate(
            {"handler": "h", "principals": PRINCIPAL}
        ),
        "row_filter_unknown_field": lambda: DataplaneRowFilter.model_validate(
            {"handler": "h", "principal": PRINCIPAL, "token": TOKEN}
        ),
        "row_filter_no_handler": lambda: DataplaneRowFilter.model_validate({**RAW_FILTER, "handler": None}),
        "verdict_without_dataset_id": lambda: DecisionEnvelope.model_validate(
            {"decision": "allow", "datasets": [{"row_filter": RAW_FILTER}]}
        ),
        "claim_check_bad_binds": lambda: ClaimCheck.model_validate(
            {
                "handler": "h",
                "table": "t",
                "binds": "nobody",
                "caller": {"sub": PRINCIPAL, "token": TOKEN},
                "keys": [KEY],
            }
        ),
        "plan_in_without_column": lambda: Plan.model_validate({"kind": "in", "values": [KEY_VALUE]}),
        "dps_start_missing_agreement": lambda: DataFlowStartMessage.model_validate(
            {k: v for k, v in START.items() if k != "agreementId"}
        ),
        "pull_token_two_audiences": lambda: PullTokenClaims.model_validate(
            {"jti": JTI, "iss": "i", "sub": "i", "aud": [TOKEN, TOKEN], "iat": 1}
        ),
        "pull_token_sub_not_iss": lambda: PullTokenClaims.model_validate(
            {"jti": JTI, "iss": "i", "sub": PRINCIPAL, "aud": "a", "iat": 1}
        ),
        "cache_key_secret_too_short": lambda: PlanCacheSettings(row_filters_cache_key_secret="pod:IT001E0"),
    }


@pytest.mark.parametrize("name", sorted(_invalid()))
def test_rf08_validation_error_text_carries_no_key_principal_or_token(name: str) -> None:
    with pytest.raises(ValidationError) as err:
        _invalid()[name]()
    for text in (str(err.value), repr(err.value)):
        for secret in (*SECRETS, "pod:IT001E0"):
            assert secret not in text, (name, text)
    # still useful: the error names the field or rule that failed
    assert err.value.errors(include_input=False)


def _contract_models() -> list[type[BaseModel]]:
    found: dict[str, type[BaseModel]] = {}
    for info in pkgutil.iter_modules(dataplane_contracts.__path__):
        module = importlib.import_module(f"dataplane_contracts.{info.name}")
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, BaseModel) and obj.__module__.startswith("dataplane_contracts"):
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return [found[k] for k in sorted(found)]


@pytest.mark.parametrize("model", _contract_models(), ids=lambda m: m.__qualname__)
def test_rf08_every_contracts_model_hides_input_in_errors(model: type[BaseModel]) -> None:
    assert model.model_config.get("hide_input_in_errors") is True
