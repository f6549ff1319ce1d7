"""GS-01 / GS-02 access records on `dataplane.audit` and the gateway's metrics."""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from dataplane_local.doubles.ds_connector import ROOT, DsConnectorDouble
from dataplane_testing.gateway import AGREEMENT, AUDIENCE, CONSUMER, FakeResolver, World, ds_policy
from dataplane_testing.metrics import scrape
from dataplane_testing.metrics import series as metric
from dataplane_testing.topics import TopicTail

TRACE = "0af7651916cd43dd8448eb211c80319c"
SKM = {"handler": "subject_key_match", "args": {"column": "pod", "key_type": "pod"}}


def audit_records(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [r.msg for r in caplog.records if r.name == "dataplane.audit" and isinstance(r.msg, dict)]


def edr_headers(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "Edc-Contract-Agreement-Id": AGREEMENT}


def assert_nothing_personal(records: list[dict[str, Any]], *secrets: str) -> None:
    """Never a name, email, token or key in a record (GS-01)."""
    text = repr(records)
    assert "name-of-" not in text and "service-account-" not in text and "@" not in text
    for secret in secrets:
        assert secret not in text


async def test_gs01_one_record_per_dataset_read_sharing_the_request_id(
    client: httpx.AsyncClient, world: World, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dataplane.audit")
    token = world.service_token()
    r = await client.post(
        "/query",
        json={"sql": "SELECT a.id FROM assets a JOIN members m ON m.id = a.id"},
        headers={
            "Authorization": f"Bearer {token}",
            "X-Request-ID": "req-42",
            "traceparent": f"00-{TRACE}-b7ad6b7169203331-01",
        },
    )
    assert r.status_code == 200, r.text
    records = audit_records(caplog)
    assert sorted(rec["resource"] for rec in records) == ["assets", "members"]
    for rec in records:
        assert rec["event"] == "access" and rec["outcome"] == "allowed" and rec["reason"] is None
        assert rec["request_id"] == "req-42" and rec["trace_id"] == TRACE
        assert rec["action"] == "dataset.query" and rec["service_account"] is True
    assert_nothing_personal(records, token, token.split(".")[1])


async def test_gs01_no_dataset_resolved_is_one_record_with_resource_null(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dataplane.audit")
    for sql, code in (("SELECT * FROM no_such_dataset", "unknown_dataset"), ("SELECT 1", "sql_refused")):
        caplog.clear()
        r = await client.post("/query", json={"sql": sql}, headers={"X-Request-ID": f"req-{code}"})
        assert r.status_code == 400 and r.json()["error"] == code, r.text
        [rec] = audit_records(caplog)
        assert (rec["event"], rec["outcome"], rec["reason"], rec["resource"]) == (
            "access",
            "error",
            code,
            None,
        )
        assert rec["action"] == "dataset.query" and rec["request_id"] == f"req-{code}"
        assert rec["sub"] is None and rec["client_id"] is None


async def test_gs02_a_refusal_is_a_denied_record_with_its_reason(
    client: httpx.AsyncClient, world: World, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dataplane.audit")
    token = world.user_token("user-7", organization={"org-a": {"groups": ["/viewers"]}})
    r = await client.post(
        "/query", json={"sql": "SELECT id FROM unscoped"}, headers={"Authorization": f"Bearer {token}"}
    )
    assert r.status_code == 403
    [rec] = audit_records(caplog)
    assert (rec["event"], rec["outcome"], rec["reason"], rec["resource"]) == (
        "denied",
        "denied",
        "policy",
        "unscoped",
    )
    # the bearer verified: the caller is named, and the refusal is of the dataset read
    assert rec["sub"] == "user-7" and rec["action"] == "dataset.query"
    assert_nothing_personal([rec], token)


async def test_gs02_an_unverifiable_bearer_is_recorded_as_auth_token_naming_no_caller(
    client: httpx.AsyncClient, world: World, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dataplane.audit")
    forged = world.issuer.mint(
        {"sub": "user-9", "email": "user-9@mail.example"},
        audience=AUDIENCE,
        sign_with=ec.generate_private_key(ec.SECP256R1()),
    )
    for authorization in ("Bearer not-a-jwt", f"Bearer {forged}"):
        caplog.clear()
        r = await client.post(
            "/query", json={"sql": "SELECT id FROM notes"}, headers={"Authorization": authorization}
        )
        assert r.status_code == 401 and r.json()["error"] == "invalid_token", r.text
        [rec] = audit_records(caplog)
        assert (rec["event"], rec["action"], rec["outcome"], rec["reason"]) == (
            "denied",
            "auth.token",
            "denied",
            "invalid_token",
        )
        # refused before any dataset was judged, and no caller: the token did not verify
        assert rec["resource"] is None and rec["sub"] is None and rec["client_id"] is None
        assert_nothing_personal([rec], forged.split(".")[1], "user-9")


async def test_gs02_an_unverifiable_edr_token_is_recorded_as_auth_token(
    client: httpx.AsyncClient, world: World, ds: DsConnectorDouble, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dataplane.audit")
    forged = DsConnectorDouble(ds_policy(["stats"])).mint_edr(CONSUMER, AGREEMENT)
    r = await client.post("/query", json={"sql": "SELECT id FROM stats"}, headers=edr_headers(forged))
    assert r.status_code == 401 and r.json()["error"] == "invalid_token", r.text
    [rec] = audit_records(caplog)
    assert (rec["action"], rec["reason"], rec["resource"], rec["sub"]) == (
        "auth.token",
        "invalid_token",
        None,
        None,
    )
    assert ds.calls("authorize") == []
    assert_nothing_personal([rec], forged.split(".")[1])


async def test_gs01_a_dataspace_read_names_the_consumer_agreement_and_decision(
    client: httpx.AsyncClient, world: World, ds: DsConnectorDouble, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dataplane.audit")
    rf = {**SKM, "keys": ["pod:pod-1"], "principals": ["alice-principal"]}
    ds.set_policy(ds_policy([{"dataset_id": "readings", "row_filter": rf}, "stats"]))
    token = world.edr()
    r = await client.post(
        "/query",
        json={"sql": "SELECT r.id FROM readings r JOIN stats s ON s.id = r.id ORDER BY r.id"},
        headers={**edr_headers(token), "X-Request-ID": "req-ds"},
    )
    assert r.status_code == 200, r.text
    assert r.json()["items"] == [{"id": 1}]
    [call] = ds.calls("authorize")
    decision_ref = ds.decide(ROOT, call.body)["decision_ref"]
    records = audit_records(caplog)
    assert sorted(rec["resource"] for rec in records) == ["readings", "stats"]
    for rec in records:
        assert (rec["event"], rec["outcome"], rec["action"]) == ("access", "allowed", "dataset.query")
        # the dataspace caller is the consumer, as both sub and client_id
        assert rec["sub"] == CONSUMER and rec["client_id"] == CONSUMER and rec["service_account"] is False
        assert rec["agreement_id"] == AGREEMENT and rec["decision_ref"] == decision_ref
        assert rec["request_id"] == "req-ds"
    # the consumer is a DID (it carries no `@`); no key, principal or token
    text = repr(records)
    for secret in ("pod-1", "alice-principal", token, token.split(".")[1]):
        assert secret not in text


async def test_gs02_a_dataspace_refusal_after_ds_answered_keeps_the_release_link(
    client: httpx.AsyncClient, world: World, ds: DsConnectorDouble, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dataplane.audit")
    ds.set_policy(ds_policy(["hidden"]))
    r = await client.post("/query", json={"sql": "SELECT id FROM hidden"}, headers=edr_headers(world.edr()))
    assert r.status_code == 403 and r.json()["error"] == "not_available", r.text
    [call] = ds.calls("authorize")
    [rec] = audit_records(caplog)
    assert (rec["event"], rec["reason"], rec["resource"], rec["sub"]) == (
        "denied",
        "not_available",
        "hidden",
        CONSUMER,
    )
    assert rec["agreement_id"] == AGREEMENT
    assert rec["decision_ref"] == ds.decide(ROOT, call.body)["decision_ref"]


async def test_metrics_count_requests_by_route_status_and_code(client: httpx.AsyncClient) -> None:
    key = {"code": "not_available", "route": "/query", "status": "403"}
    before = metric(await scrape(client), "query_gateway_requests_total", **key)
    await client.post("/query", json={"sql": "SELECT id FROM hidden"})
    await client.post("/query", json={"sql": "SELECT id FROM secret_ds"})
    after = metric(await scrape(client), "query_gateway_requests_total", **key)
    assert after - before == 2


async def test_metrics_count_plan_cache_hits_misses_and_disclosures_published(
    client: httpx.AsyncClient,
    world: World,
    ds: DsConnectorDouble,
    flushed: FakeResolver,
    disclosures: TopicTail,
) -> None:
    def counts(text: str) -> tuple[float, float, float]:
        return (
            metric(text, "query_gateway_plan_cache_total", result="miss"),
            metric(text, "query_gateway_plan_cache_total", result="hit"),
            metric(text, "query_gateway_disclosures_published_total"),
        )

    # a caller never seen before: its lookup plan is in no tier yet
    token = world.user_token(f"user-{uuid.uuid4().hex[:8]}", preferred_username="name-of-user-2")
    sql, auth = {"sql": "SELECT id FROM registry ORDER BY id"}, {"Authorization": f"Bearer {token}"}
    start = counts(await scrape(client))
    first = await client.post("/query", json=sql, headers=auth)
    assert [row["id"] for row in first.json()["items"]] == [1, 3], first.text
    after_miss = counts(await scrape(client))
    assert [b - a for a, b in zip(start, after_miss, strict=True)] == [1, 0, 0]
    second = await client.post("/query", json=sql, headers=auth)
    assert [row["id"] for row in second.json()["items"]] == [1, 3]
    after_hit = counts(await scrape(client))
    assert [b - a for a, b in zip(after_miss, after_hit, strict=True)] == [0, 1, 0]
    assert len(flushed.requests) == 1  # the miss was resolved once; the hit asked nobody

    # a dataspace read of two datasets: two disclosure events, each acknowledged
    ds.set_policy(ds_policy(["stats", {"dataset_id": "assets", "organizations": ["org-a"]}]))
    transfer = f"tp-{uuid.uuid4().hex[:8]}"
    r = await client.post(
        "/query",
        json={"sql": "SELECT s.id FROM stats s JOIN assets a ON a.id = s.id ORDER BY s.id"},
        headers={**edr_headers(world.edr()), "Edc-Transfer-Process-Id": transfer},
    )
    assert r.json()["items"] == [{"id": 1}], r.text
    # filtered by transfer id: the tail may still see an earlier test's last event
    mine = await disclosures.read_where(2, lambda rec: json.loads(rec.value)["transfer_id"] == transfer)
    assert sorted(json.loads(rec.value)["dataset_id"] for rec in mine) == ["assets", "stats"]
    after_read = counts(await scrape(client))
    assert [b - a for a, b in zip(after_hit, after_read, strict=True)] == [0, 0, 2]

    # a refused dataspace read publishes nothing and counts nothing
    ds.set_policy(ds_policy([{"dataset_id": "stats", "decision": "deny", "reason": "no"}]))
    refused = await client.post(
        "/query", json={"sql": "SELECT id FROM stats"}, headers=edr_headers(world.edr())
    )
    assert refused.status_code == 403
    assert counts(await scrape(client)) == after_read
