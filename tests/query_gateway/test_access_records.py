"""GS-01 / GS-02 access records on `dataplane.audit` and the gateway's metrics."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest
from gateway_support import World

TRACE = "0af7651916cd43dd8448eb211c80319c"


def audit_records(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [r.msg for r in caplog.records if r.name == "dataplane.audit" and isinstance(r.msg, dict)]


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
    text = repr(records)
    assert "service-account-some-service" not in text and "@" not in text  # never a name or email


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
    assert rec["sub"] == "user-7"
    assert "name-of-user-7" not in repr(rec) and "mail.example" not in repr(rec)


async def test_metrics_count_requests_by_path_status_and_code(client: httpx.AsyncClient) -> None:
    await client.post("/query", json={"sql": "SELECT id FROM hidden"})
    body = (await client.get("/metrics")).text
    assert 'query_gateway_requests_total{code="not_available",path="/query",status="403"}' in body
    assert "query_gateway_plan_cache_total" in body or "query_gateway_disclosures_published_total" in body
