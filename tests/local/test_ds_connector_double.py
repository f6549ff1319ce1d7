"""The ds connector development double answers as specified, over real HTTP."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest

from dataplane_local.doubles.ds_connector import DsConnectorDouble, create_app
from dataplane_local.doubles.oidc import start_oidc_issuer
from dataplane_local.doubles.server import RunningServer, serve_in_thread
from dataplane_testing.processes import double_process

REF = "ab" * 32
POLICY: dict[str, Any] = {
    "participant_id": "did:web:provider.example",
    "agreements": {
        "agr-1": {
            "consumer": "did:web:consumer.example",
            "cache": {"ttl_seconds": 120},
            "datasets": [
                {
                    "dataset_id": "meter_readings",
                    "row_filter": {
                        "handler": "subject_key_match",
                        "args": {"column": "pod", "key_type": "pod"},
                    },
                    "consent": "meters",
                    "organizations": ["rec-demo"],
                    "cache": {"ttl_seconds": 30},
                    "decision_ref": REF,
                },
                "open_data",
                {"dataset_id": "weird", "row_filter": {"handler": "nope", "colour": "blue"}},
                {"dataset_id": "closed", "decision": "deny", "reason": "consent_missing"},
            ],
        }
    },
    "consents": {
        "meters": [
            {"subject_did": "did:web:bob.example", "keys": ["pod:P2"]},
            {"subject_did": "did:web:alice.example", "keys": ["pod:P1"]},
            {"subject_did": "did:web:carol.example", "keys": ["pod:P3"], "withdrawn": True},
        ]
    },
    "participants": {"provider-b": {"participant_id": "did:web:b.example", "agreements": {}}},
}


@pytest.fixture
def ds() -> Iterator[tuple[DsConnectorDouble, RunningServer]]:
    state = DsConnectorDouble(POLICY)
    server = serve_in_thread(create_app(state))
    yield state, server
    server.stop()


def authorize(
    url: str, agreement: str, datasets: list[str], consumer: str = "did:web:consumer.example"
) -> Any:
    body = {
        "consumer_did": consumer,
        "agreement_id": agreement,
        "transfer_id": "tp-1",
        "purpose": ["research"],
        "dataset_ids": datasets,
    }
    return httpx.post(f"{url}/internal/dataplane/authorize", json=body)


def test_edr_token_verifies_against_served_jwks_per_participant(
    ds: tuple[DsConnectorDouble, RunningServer],
) -> None:
    state, server = ds
    token = state.mint_edr("did:web:consumer.example", "agr-1")
    keys = httpx.get(f"{server.url}/internal/edr-jwks").json()["keys"]
    assert len(keys) == 1 and keys[0]["kty"] == "EC" and keys[0]["crv"] == "P-256" and "d" not in keys[0]
    claims = jwt.decode(
        token, jwt.PyJWK.from_dict(keys[0]).key, algorithms=["ES256"], options={"verify_aud": False}
    )
    assert claims["aud"] == "did:web:consumer.example"
    assert claims["iss"] == claims["sub"] == "did:web:provider.example"
    assert "exp" not in claims and claims["jti"] and isinstance(claims["iat"], int)
    # the other participant has its own key: the root's token does not verify against it
    b_keys = httpx.get(f"{server.url}/provider-b/internal/edr-jwks").json()["keys"]
    with pytest.raises(jwt.InvalidSignatureError):
        jwt.decode(
            token, jwt.PyJWK.from_dict(b_keys[0]).key, algorithms=["ES256"], options={"verify_aud": False}
        )
    b_token = state.mint_edr("did:web:consumer.example", participant="provider-b")
    assert jwt.decode(b_token, options={"verify_signature": False})["iss"] == "did:web:b.example"
    assert httpx.get(f"{server.url}/nobody/internal/edr-jwks").status_code == 404


def test_authorize_allow_carries_verbatim_filter_consents_and_envelope(
    ds: tuple[DsConnectorDouble, RunningServer],
) -> None:
    _, server = ds
    answer = authorize(server.url, "agr-1", ["meter_readings", "open_data", "weird"]).json()
    assert answer["decision"] == "allow" and answer["decision_ref"] == REF
    assert answer["cache"] == {"ttl_seconds": 30}
    assert answer["agreement_id"] == "agr-1" and answer["transfer_id"] == "tp-1"
    verdicts = {v["dataset_id"]: v for v in answer["datasets"]}
    meter = verdicts["meter_readings"]
    assert meter["row_filter"] == {
        "handler": "subject_key_match",
        "args": {"column": "pod", "key_type": "pod"},
        "keys": ["pod:P1", "pod:P2"],
        "subject_dids": ["did:web:alice.example", "did:web:bob.example"],
    }
    assert meter["organizations"] == ["rec-demo"]
    assert "row_filter" not in verdicts["open_data"]
    assert verdicts["weird"]["row_filter"] == {"handler": "nope", "colour": "blue"}


def test_authorize_denies_unknown_agreement_consumer_mismatch_and_unlisted(
    ds: tuple[DsConnectorDouble, RunningServer],
) -> None:
    _, server = ds
    unknown = authorize(server.url, "agr-x", ["meter_readings"]).json()
    assert unknown["decision"] == "deny" and unknown["reason"] == "agreement_unknown"
    assert unknown["decision_ref"] is None
    mismatch = authorize(server.url, "agr-1", ["meter_readings"], consumer="did:web:mallory.example").json()
    assert mismatch["decision"] == "deny" and mismatch["reason"] == "consumer_mismatch"
    unlisted = authorize(server.url, "agr-1", ["meter_readings", "other"]).json()
    assert unlisted["decision"] == "deny" and unlisted["reason"] == "dataset_not_in_agreement"
    closed = authorize(server.url, "agr-1", ["closed"]).json()
    assert closed["decision"] == "deny" and closed["reason"] == "consent_missing"


def test_default_decision_ref_is_64_hex_and_null_omits_it(
    ds: tuple[DsConnectorDouble, RunningServer],
) -> None:
    state, server = ds
    ref = authorize(server.url, "agr-1", ["open_data"]).json()["decision_ref"]
    assert len(ref) == 64 and int(ref, 16) >= 0
    policy = json.loads(json.dumps(POLICY))
    policy["agreements"]["agr-1"]["datasets"][1] = {"dataset_id": "open_data", "decision_ref": None}
    state.set_policy(policy)
    assert "decision_ref" not in authorize(server.url, "agr-1", ["open_data"]).json()


def test_audit_is_recorded_with_idempotency_key(ds: tuple[DsConnectorDouble, RunningServer]) -> None:
    state, server = ds
    body = {"dataset_id": "meter_readings", "consumer_id": "did:web:consumer.example", "row_count": 2}
    r = httpx.post(
        f"{server.url}/provider-b/internal/audit/query", json=body, headers={"Idempotency-Key": "e-1"}
    )
    assert r.status_code == 200 and r.json() == {}
    calls = httpx.get(f"{server.url}/_calls", params={"endpoint": "audit"}).json()
    assert [(c["participant"], c["body"], c["headers"]["idempotency-key"]) for c in calls] == [
        ("provider-b", body, "e-1")
    ]
    assert [c.body for c in state.calls("audit", "provider-b")] == [body]


def test_faults_by_count_and_by_participant_over_http(ds: tuple[DsConnectorDouble, RunningServer]) -> None:
    _, server = ds
    fault = {"action": "fault", "endpoint": "authorize", "status": 500, "count": 2, "participant": ""}
    assert httpx.post(f"{server.url}/_control", json=fault).status_code == 200
    assert authorize(server.url, "agr-1", ["open_data"]).status_code == 500
    # the other participant is not affected
    other = httpx.post(f"{server.url}/provider-b/internal/audit/query", json={})
    assert other.status_code == 200
    assert authorize(server.url, "agr-1", ["open_data"]).status_code == 500
    assert authorize(server.url, "agr-1", ["open_data"]).status_code == 200
    # a timed fault on every endpoint, then cleared
    httpx.post(f"{server.url}/_control", json={"action": "fault", "status": 503, "seconds": 60})
    assert httpx.get(f"{server.url}/internal/edr-jwks").status_code == 503
    httpx.post(f"{server.url}/_control", json={"action": "clear_faults"})
    assert httpx.get(f"{server.url}/internal/edr-jwks").status_code == 200
    # a 200 with a body of the test's choosing replaces the decision
    httpx.post(
        f"{server.url}/_control",
        json={"action": "fault", "endpoint": "authorize", "status": 200, "body": {"odd": 1}, "count": 1},
    )
    assert authorize(server.url, "agr-1", ["open_data"]).json() == {"odd": 1}
    statuses = [
        c["status"] for c in httpx.get(f"{server.url}/_calls", params={"endpoint": "authorize"}).json()
    ]
    assert statuses == [500, 500, 200, 200]
    httpx.post(f"{server.url}/_control", json={"action": "clear_calls"})
    assert httpx.get(f"{server.url}/_calls").json() == []


def test_consent_withdrawn_at_runtime_narrows_the_next_decision_and_can_be_granted_again(
    ds: tuple[DsConnectorDouble, RunningServer],
) -> None:
    """The demo's live withdrawal: one subject's consent changes over HTTP, the rest of the
    policy (and the signing key) stays; each authorize call records the decision it answered."""
    state, server = ds
    token = state.mint_edr("did:web:consumer.example", "agr-1")
    control = f"{server.url}/_control"
    change = {"action": "consent", "consent": "meters", "subject_did": "did:web:bob.example"}
    assert httpx.post(control, json={**change, "withdrawn": True}).status_code == 200
    narrowed = authorize(server.url, "agr-1", ["meter_readings"]).json()["datasets"][0]["row_filter"]
    assert narrowed["keys"] == ["pod:P1"] and narrowed["subject_dids"] == ["did:web:alice.example"]
    assert httpx.post(control, json={**change, "withdrawn": False}).status_code == 200
    again = authorize(server.url, "agr-1", ["meter_readings"]).json()["datasets"][0]["row_filter"]
    assert again["keys"] == ["pod:P1", "pod:P2"]
    unknown = {**change, "subject_did": "did:web:nobody.example", "withdrawn": True}
    assert httpx.post(control, json=unknown).status_code == 422
    keys = httpx.get(f"{server.url}/internal/edr-jwks").json()["keys"]
    assert jwt.decode(
        token, jwt.PyJWK.from_dict(keys[0]).key, algorithms=["ES256"], options={"verify_aud": False}
    )
    calls = httpx.get(f"{server.url}/_calls", params={"endpoint": "authorize"}).json()
    answers = [c["answer"]["datasets"][0]["row_filter"]["keys"] for c in calls]
    assert answers == [["pod:P1"], ["pod:P1", "pod:P2"]]


def test_policy_replaced_and_edr_minted_over_http(ds: tuple[DsConnectorDouble, RunningServer]) -> None:
    _, server = ds
    before = httpx.get(f"{server.url}/internal/edr-jwks").json()
    new_policy = {
        "participant_id": "did:web:provider.example",
        "agreements": {"agr-2": {"consumer": "did:web:c"}},
    }
    assert (
        httpx.post(f"{server.url}/_control", json={"action": "policy", "policy": new_policy}).status_code
        == 200
    )
    assert authorize(server.url, "agr-1", ["open_data"]).json()["reason"] == "agreement_unknown"
    assert httpx.get(f"{server.url}/internal/edr-jwks").json() == before  # the key survives a policy swap
    r = httpx.post(
        f"{server.url}/_control", json={"action": "mint_edr", "consumer": "did:web:c", "jti": "j-1"}
    )
    token = r.json()["token"]
    key = jwt.PyJWK.from_dict(before["keys"][0]).key
    assert jwt.decode(token, key, algorithms=["ES256"], options={"verify_aud": False})["jti"] == "j-1"
    assert httpx.post(f"{server.url}/_control", json={"action": "explode"}).status_code == 422


def test_service_bearer_checked_against_oidc_jwks_when_configured(
    ds: tuple[DsConnectorDouble, RunningServer],
) -> None:
    state, server = ds
    issuer, oidc = start_oidc_issuer(clients={"svc": "s3cret"})
    try:
        state.set_service_auth({"jwks_url": f"{issuer.base_url}/protocol/openid-connect/certs"})
        assert httpx.get(f"{server.url}/internal/edr-jwks").status_code == 401
        bad = httpx.get(f"{server.url}/internal/edr-jwks", headers={"Authorization": "Bearer x.y.z"})
        assert bad.status_code == 401
        token = httpx.post(
            f"{issuer.base_url}/protocol/openid-connect/token",
            data={"grant_type": "client_credentials", "client_id": "svc", "client_secret": "s3cret"},
        ).json()["access_token"]
        good = httpx.get(f"{server.url}/internal/edr-jwks", headers={"Authorization": f"Bearer {token}"})
        assert good.status_code == 200
    finally:
        oidc.stop()


def test_runs_as_a_process_with_a_yaml_policy(tmp_path: Path) -> None:
    with double_process("dataplane_local.doubles.ds_connector", POLICY, tmp_path) as url:
        assert authorize(url, "agr-1", ["open_data"]).json()["decision"] == "allow"
        token = httpx.post(f"{url}/_control", json={"action": "mint_edr", "consumer": "did:web:c"}).json()[
            "token"
        ]
        key = jwt.PyJWK.from_dict(httpx.get(f"{url}/internal/edr-jwks").json()["keys"][0]).key
        assert (
            jwt.decode(token, key, algorithms=["ES256"], options={"verify_aud": False})["aud"] == "did:web:c"
        )
