"""GS-14 across processes: the two gateway replicas of the local stack take from one bucket per
consumer and dataset (the stack's Redis). A consumer reading the limited dataset alternately on
each replica is refused `429 rate_limited` with `Retry-After` by both once its burst is spent;
another consumer reading the same dataset is served meanwhile; after the wait the first consumer
is served again. Each replica counts and records its refusals with the code."""

from __future__ import annotations

import asyncio
import uuid

import httpx
import pytest

from dataplane_local.demo import DEMO_CONSUMER
from dataplane_testing.e2e import LIMITED_DATASET, System

pytestmark = pytest.mark.e2e

SQL = f"SELECT pod FROM {LIMITED_DATASET} ORDER BY pod"
OTHER_CONSUMER = "did:web:other-consumer.example"
VERDICT = {"dataset_id": LIMITED_DATASET, "decision": "allow"}


async def _agreement(system: System, consumer: str) -> tuple[str, str]:
    """An agreement of `consumer` over the limited dataset, and an EDR token of it."""
    name = f"agr-rl-{uuid.uuid4().hex[:10]}"
    system.policy["agreements"][name] = {"consumer": consumer, "datasets": [dict(VERDICT)]}
    await system.ds_control({"action": "policy", "policy": system.policy})
    minted = await system.ds_control({"action": "mint_edr", "consumer": consumer, "agreement": name})
    return name, str(minted["token"])


async def _read(system: System, gateway: str, agreement: str, token: str) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}", "Edc-Contract-Agreement-Id": agreement}
    return await system.http.post(f"{gateway}/query", json={"sql": SQL, "limit": 1}, headers=headers)


async def _rate_limited(system: System, gateway: str) -> float:
    text = (await system.http.get(f"{gateway}/metrics")).text
    for line in text.splitlines():
        if line.startswith("query_gateway_requests_total{") and 'code="rate_limited"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_gs14_a_consumer_over_its_rate_is_refused_by_both_replicas_and_the_bucket_refills(
    system: System,
) -> None:
    first, second = system.gateways[:2]
    agreement, token = await _agreement(system, DEMO_CONSUMER)
    other_agreement, other_token = await _agreement(system, OTHER_CONSUMER)
    counted = [await _rate_limited(system, g) for g in (first, second)]
    audited = [
        system.audited(i, "dataset.query", "rate_limited") for i in ("query-gateway", "query-gateway-2")
    ]

    # the burst of two, one read on each replica, then each replica refuses
    served = [await _read(system, g, agreement, token) for g in (first, second)]
    assert [r.status_code for r in served] == [200, 200], [r.text for r in served]
    refused = [await _read(system, g, agreement, token) for g in (first, second)]
    for r in refused:
        assert r.status_code == 429, r.text
        assert r.json()["error"] == "rate_limited" and "items" not in r.json()
        assert 1 <= int(r.headers["Retry-After"]) <= 2
        assert DEMO_CONSUMER not in r.text

    # another consumer of the same dataset is served by both meanwhile
    for g in (first, second):
        r = await _read(system, g, other_agreement, other_token)
        assert r.status_code == 200, r.text

    # each replica counted and recorded its own refusal
    assert [await _rate_limited(system, g) for g in (first, second)] == [c + 1 for c in counted]
    instances = ("query-gateway", "query-gateway-2")
    assert [system.audited(i, "dataset.query", "rate_limited") for i in instances] == [a + 1 for a in audited]

    # the bucket refills: after the wait the consumer is served again, on either replica
    await asyncio.sleep(int(refused[-1].headers["Retry-After"]))
    r = await _read(system, first, agreement, token)
    assert r.status_code == 200, r.text
