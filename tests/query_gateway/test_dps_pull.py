"""DPS-09: the pull on `POST /dps/public/query`, against a pull-grant view seeded here in the
shape signaling publishes (token_id, flow_id, state, agreement_id, dataset_id, participant_id,
counter_party_id)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import asyncpg
import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from dataplane_local.doubles.ds_connector import DsConnectorDouble
from dataplane_testing.gateway import (
    AGREEMENT,
    CONSUMER,
    KEY,
    PROVIDER,
    ds_policy,
    grant,
    pull_token,
    refused,
)
from dataplane_testing.topics import TopicTail


async def pull(client: httpx.AsyncClient, authorization: str | None, **headers: str) -> httpx.Response:
    h = dict(headers)
    if authorization is not None:
        h["Authorization"] = authorization
    return await client.post("/dps/public/query", json={"sql": "SELECT id FROM stats ORDER BY id"}, headers=h)


async def test_dps09_a_started_flow_serves_rows_under_its_own_agreement(
    pull_client: httpx.AsyncClient, flows_url: str, ds: DsConnectorDouble, disclosures: TopicTail
) -> None:
    ds.set_policy(ds_policy(["stats"]))
    jti = await grant(flows_url)
    r = await pull(pull_client, pull_token(jti), **{"Edc-Transfer-Process-Id": "tp-9", "Edc-Purpose": "a,b"})
    assert r.status_code == 200, r.text
    assert [row["id"] for row in r.json()["items"]] == [1, 2]
    [call] = ds.calls("authorize")
    assert call.body["agreement_id"] == AGREEMENT and call.body["consumer_did"] == CONSUMER
    assert call.body["transfer_id"] == "tp-9" and call.body["purpose"] == ["a", "b"]
    [record] = await disclosures.read(1)
    assert json.loads(record.value)["provider_participant"] == PROVIDER


async def test_dps09_the_token_is_read_with_or_without_bearer(
    pull_client: httpx.AsyncClient, flows_url: str, ds: DsConnectorDouble
) -> None:
    ds.set_policy(ds_policy(["stats"]))
    jti = await grant(flows_url)
    token = pull_token(jti)
    for authorization in (token, f"Bearer {token}", f"bearer  {token} "):
        r = await pull(pull_client, authorization)
        assert r.status_code == 200, r.text
        assert r.json()["items"] == [{"id": 1}, {"id": 2}]


async def test_dps09_no_valid_token_no_rows(pull_client: httpx.AsyncClient, ds: DsConnectorDouble) -> None:
    for auth in (None, "", "Bearer ", "junk"):
        refused(await pull(pull_client, auth), 401, "pull_token")
    assert ds.calls("authorize") == []


async def test_dps09_a_token_from_another_data_plane_is_401(
    pull_client: httpx.AsyncClient, flows_url: str
) -> None:
    jti = await grant(flows_url)
    refused(
        await pull(pull_client, pull_token(jti, key=ec.generate_private_key(ec.SECP256R1()))),
        401,
        "pull_token",
    )


async def test_dps09_a_token_that_is_not_live_is_401(pull_client: httpx.AsyncClient, flows_url: str) -> None:
    jti = await grant(flows_url)
    conn = await asyncpg.connect(flows_url)
    await conn.execute("DELETE FROM dps_pull_grants WHERE token_id = $1", jti)  # retired: no cache
    await conn.close()
    refused(await pull(pull_client, pull_token(jti)), 401, "pull_token")


async def test_dps09_a_flow_not_started_is_403(pull_client: httpx.AsyncClient, flows_url: str) -> None:
    jti = await grant(flows_url, state="SUSPENDED")
    refused(await pull(pull_client, pull_token(jti)), 403, "flow_not_started")


async def test_dps09_a_token_not_matching_its_flow_is_401(
    pull_client: httpx.AsyncClient, flows_url: str
) -> None:
    jti = await grant(flows_url)
    refused(await pull(pull_client, pull_token(jti, aud="did:web:someone-else")), 401, "pull_token")
    refused(await pull(pull_client, pull_token(jti, iss="did:web:other-provider")), 401, "pull_token")


async def test_dps09_an_agreement_header_naming_another_agreement_is_403(
    pull_client: httpx.AsyncClient, flows_url: str, ds: DsConnectorDouble
) -> None:
    ds.set_policy(ds_policy(["stats"]))
    jti = await grant(flows_url)
    refused(
        await pull(pull_client, pull_token(jti), **{"Edc-Contract-Agreement-Id": "agr-x"}),
        403,
        "agreement_mismatch",
    )
    assert (
        await pull(pull_client, pull_token(jti), **{"Edc-Contract-Agreement-Id": AGREEMENT})
    ).status_code == 200


@pytest.fixture(scope="module", autouse=True)
async def first_uses(flows_url: str) -> str:
    """Signaling's first-use function in this module's stand-in for the view, recording each call
    (the real one promotes a renewal's pending pair: tests/signaling/test_http_pull_renewal.py)."""
    conn = await asyncpg.connect(flows_url)
    await conn.execute(
        "CREATE TABLE IF NOT EXISTS first_uses (token_id text);"
        "CREATE OR REPLACE FUNCTION dps_pull_token_used(t text) RETURNS void LANGUAGE sql"
        " AS 'INSERT INTO first_uses VALUES (t)'"
    )
    await conn.close()
    return flows_url


async def used(flows_url: str, jti: str) -> int:
    conn = await asyncpg.connect(flows_url)
    n: int = await conn.fetchval("SELECT count(*) FROM first_uses WHERE token_id = $1", jti)
    await conn.close()
    return n


def access_token(jti: str, ttl: int = 300, alg: str = "ES256", **over: Any) -> str:
    """An http-pull access token as signaling issues it, for the grant `grant(...)` seeded."""
    now = int(time.time())
    claims: dict[str, Any] = {
        "jti": jti,
        "iss": PROVIDER,
        "sub": CONSUMER,
        "aud": PROVIDER,
        "iat": now,
        "exp": now + ttl,
        "dataFlowId": f"flow-{jti[:8]}",
        "datasetId": "stats",
        "agreementId": AGREEMENT,
    }
    claims.update(over)
    return jwt.encode(claims, None if alg == "none" else KEY, algorithm=alg)


async def test_http_pull_a_live_access_token_pulls_as_its_subject(
    pull_client: httpx.AsyncClient, flows_url: str, ds: DsConnectorDouble
) -> None:
    ds.set_policy(ds_policy(["stats"]))
    jti = await grant(flows_url)
    r = await pull(pull_client, f"Bearer {access_token(jti)}")
    assert r.status_code == 200, r.text
    assert r.json()["items"] == [{"id": 1}, {"id": 2}]
    [call] = ds.calls("authorize")
    assert call.body["consumer_did"] == CONSUMER and call.body["agreement_id"] == AGREEMENT
    # its first use is reported to signaling once per replica, not per request
    assert (await pull(pull_client, access_token(jti))).status_code == 200
    assert await used(flows_url, jti) == 1


async def test_http_pull_a_refused_pull_is_no_use_of_the_token(
    pull_client: httpx.AsyncClient, flows_url: str, ds: DsConnectorDouble
) -> None:
    jti = await grant(flows_url, state="SUSPENDED")
    refused(await pull(pull_client, access_token(jti)), 403, "flow_not_started")
    other = await grant(flows_url)
    refused(
        await pull(pull_client, access_token(other), **{"Edc-Contract-Agreement-Id": "agr-x"}),
        403,
        "agreement_mismatch",
    )
    assert await used(flows_url, jti) == 0 and await used(flows_url, other) == 0


async def test_http_pull_an_expired_access_token_is_401_with_its_own_code(
    pull_client: httpx.AsyncClient, flows_url: str, ds: DsConnectorDouble, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dataplane.audit")
    ds.set_policy(ds_policy(["stats"]))
    jti = await grant(flows_url)
    now = int(time.time())
    expired = access_token(jti, iat=now - 400, exp=now - 100)
    refused(await pull(pull_client, expired), 401, "pull_token_expired")
    assert ds.calls("authorize") == []
    [rec] = audit_records(caplog)
    assert (rec["event"], rec["reason"]) == ("denied", "pull_token_expired")
    assert expired not in repr(rec) and jti not in repr(rec)


async def test_http_pull_a_token_that_expires_after_use_is_refused_from_then_on(
    pull_client: httpx.AsyncClient, flows_url: str, ds: DsConnectorDouble
) -> None:
    """The signature memo never outlives `exp`: a token served once is refused once expired."""
    ds.set_policy(ds_policy(["stats"]))
    jti = await grant(flows_url)
    token = access_token(jti, ttl=2)
    assert (await pull(pull_client, token)).status_code == 200
    exp = jwt.decode(token, options={"verify_signature": False})["exp"]
    await asyncio.sleep(max(0.0, exp - time.time()) + 0.05)  # waits for the clock, not a threshold
    refused(await pull(pull_client, token), 401, "pull_token_expired")


async def test_http_pull_the_grant_is_still_read_on_every_request(
    pull_client: httpx.AsyncClient, flows_url: str, ds: DsConnectorDouble
) -> None:
    ds.set_policy(ds_policy(["stats"]))
    jti = await grant(flows_url)
    token = access_token(jti)
    assert (await pull(pull_client, token)).status_code == 200
    conn = await asyncpg.connect(flows_url)
    await conn.execute("UPDATE dps_pull_grants SET state = 'SUSPENDED' WHERE token_id = $1", jti)
    refused(await pull(pull_client, token), 403, "flow_not_started")
    await conn.execute("DELETE FROM dps_pull_grants WHERE token_id = $1", jti)
    await conn.close()
    refused(await pull(pull_client, token), 401, "pull_token")


@pytest.mark.parametrize(
    "claim",
    [
        {"dataFlowId": "flow-other"},
        {"datasetId": "readings"},
        {"agreementId": "agr-other"},
        {"sub": "did:web:someone-else"},
        {"aud": "did:web:someone-else"},
        {"iss": "did:web:other-provider"},
    ],
)
async def test_http_pull_claims_disagreeing_with_the_grant_are_401(
    pull_client: httpx.AsyncClient, flows_url: str, ds: DsConnectorDouble, claim: dict[str, str]
) -> None:
    jti = await grant(flows_url)
    refused(await pull(pull_client, access_token(jti, **claim)), 401, "pull_token")
    assert ds.calls("authorize") == []


async def test_http_pull_unsigned_or_incomplete_access_tokens_are_401(
    pull_client: httpx.AsyncClient, flows_url: str
) -> None:
    jti = await grant(flows_url)
    refused(await pull(pull_client, access_token(jti, alg="none")), 401, "pull_token")
    refused(await pull(pull_client, access_token(jti, dataFlowId=None)), 401, "pull_token")
    refused(await pull(pull_client, access_token(jti, exp="soon")), 401, "pull_token")


async def test_dps01_the_pull_route_is_absent_without_dps(client: httpx.AsyncClient) -> None:
    r = await client.post("/dps/public/query", json={"sql": "SELECT id FROM stats"})
    assert r.status_code == 404


def audit_records(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [r.msg for r in caplog.records if r.name == "dataplane.audit" and isinstance(r.msg, dict)]


async def test_gs01_a_pull_records_the_consumer_the_flows_agreement_and_the_decision(
    pull_client: httpx.AsyncClient, flows_url: str, ds: DsConnectorDouble, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dataplane.audit")
    ds.set_policy(ds_policy(["stats"]))
    jti = await grant(flows_url)
    token = pull_token(jti)
    r = await pull(pull_client, token, **{"X-Request-ID": "req-pull"})
    assert r.json()["items"] == [{"id": 1}, {"id": 2}], r.text
    [call] = ds.calls("authorize")
    [rec] = audit_records(caplog)
    assert (rec["event"], rec["action"], rec["route"], rec["resource"], rec["outcome"]) == (
        "access",
        "dataset.query",
        "/dps/public/query",
        "stats",
        "allowed",
    )
    assert rec["sub"] == CONSUMER and rec["client_id"] == CONSUMER
    assert rec["agreement_id"] == AGREEMENT  # the flow's, with no agreement header sent
    assert rec["decision_ref"] == ds.decide("", call.body)["decision_ref"]
    assert rec["request_id"] == "req-pull"
    for secret in (token, token.split(".")[1], jti):
        assert secret not in repr(rec)


async def test_gs02_a_refused_pull_names_the_consumer_only_once_the_token_verified(
    pull_client: httpx.AsyncClient, flows_url: str, ds: DsConnectorDouble, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dataplane.audit")
    refused(await pull(pull_client, "junk"), 401, "pull_token")
    [rec] = audit_records(caplog)
    assert (rec["event"], rec["reason"], rec["resource"], rec["sub"]) == ("denied", "pull_token", None, None)
    caplog.clear()
    jti = await grant(flows_url)
    refused(
        await pull(pull_client, pull_token(jti), **{"Edc-Contract-Agreement-Id": "agr-x"}),
        403,
        "agreement_mismatch",
    )
    [rec] = audit_records(caplog)
    assert (rec["event"], rec["reason"], rec["sub"]) == ("denied", "agreement_mismatch", CONSUMER)
    # the flow's agreement, not the header's; ds was not asked, so no decision
    assert rec["agreement_id"] == AGREEMENT and "decision_ref" not in rec
    caplog.clear()
    stopped = await grant(flows_url, state="SUSPENDED")
    refused(await pull(pull_client, pull_token(stopped)), 403, "flow_not_started")
    [rec] = audit_records(caplog)
    assert (rec["reason"], rec["sub"], rec["agreement_id"]) == ("flow_not_started", CONSUMER, AGREEMENT)
    caplog.clear()
    # a live token that is not the flow's names nobody: its audience is not the flow's consumer
    refused(await pull(pull_client, pull_token(jti, aud="did:web:someone-else")), 401, "pull_token")
    [rec] = audit_records(caplog)
    assert (rec["reason"], rec["sub"]) == ("pull_token", None)
    assert "someone-else" not in repr(rec)
    assert ds.calls("authorize") == []


async def test_rf08_captured_debug_logs_of_a_pull_carry_no_key_principal_or_token(
    pull_client: httpx.AsyncClient, flows_url: str, ds: DsConnectorDouble, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    rf = {
        "handler": "subject_key_match",
        "args": {"column": "pod", "key_type": "pod"},
        "keys": ["pod:pod-3"],
        "principals": ["erin-principal"],
        "subject_dids": ["did:web:erin.example"],
    }
    ds.set_policy(ds_policy([{"dataset_id": "readings", "row_filter": rf}]))
    jti = await grant(flows_url, dataset_id="readings")
    token = pull_token(jti)
    r = await pull_client.post(
        "/dps/public/query",
        json={"sql": "SELECT id, pod FROM readings ORDER BY id"},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert r.json()["items"] == [{"id": 3, "pod": "pod-3"}], r.text
    text = "\n".join(f"{rec.getMessage()} {rec.msg!r} {rec.args!r}" for rec in caplog.records)
    assert "narrowed_statement_withheld" in text  # DEBUG lines of this request were captured
    # the token (whole, its claims segment and its id), the key and the principal
    for secret in (token, token.split(".")[1], jti, "pod-3", "erin-principal"):
        assert secret not in text
