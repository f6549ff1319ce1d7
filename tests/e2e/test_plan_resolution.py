"""Lookup-handler plans across processes: gateway → Kafka → resolver → Redis. A repeated query is
served from the plan cache (no new PlanRequest on the topic, on either replica); a miss is
answered by the early reply copy on the gateway's Redis channel; with every
resolver stopped a query needing a new plan is 503 row_filter_unavailable, and once they are back
and ready the same query succeeds."""

from __future__ import annotations

import asyncio
import re

import pytest

from dataplane_contracts.topics import PLAN_REQUESTS
from dataplane_local.timeouts import scaled
from dataplane_testing.e2e import ALICE_PODS, System, fresh_principals, pods_of, rec_registry_verdict

pytestmark = pytest.mark.e2e


async def test_rf07_repeated_lookup_query_is_served_from_the_plan_cache(system: System) -> None:
    agreement = await system.add_agreement(rec_registry_verdict(*fresh_principals()))
    before = await system.end_offset(PLAN_REQUESTS)
    first = await system.edr_query(agreement, gateway=system.gateways[0])
    assert first.status_code == 200, first.text
    assert pods_of(first) == ALICE_PODS  # the registry's answer for alice, nothing else
    after_miss = await system.end_offset(PLAN_REQUESTS)
    assert after_miss == before + 1  # exactly one PlanRequest for the miss
    # again on the same replica (in-process tier) and on the other one (the shared Redis tier)
    for gateway in (system.gateways[0], system.gateways[1], system.gateways[0]):
        again = await system.edr_query(agreement, gateway=gateway)
        assert again.status_code == 200, again.text
        assert pods_of(again) == ALICE_PODS
    assert await system.end_offset(PLAN_REQUESTS) == after_miss  # no new PlanRequest


async def _replies_answered(system: System, gateway: str) -> dict[str, float]:
    """Replies that answered, by copy, and the plans read back from Redis after a reply."""
    text = (await system.http.get(f"{gateway}/metrics")).text
    found = re.findall(r'^query_gateway_plan_replies_total\{via="(\w+)"\} (\S+)$', text, re.MULTILINE)
    reads = re.findall(
        r'^query_gateway_plan_miss_hop_seconds_count\{hop="plan_read"\} (\S+)$', text, re.MULTILINE
    )
    return {**{via: float(n) for via, n in found}, "plan_read": float(reads[0]) if reads else 0.0}


async def test_rf07_a_miss_is_answered_by_the_early_copy_on_the_gateways_redis_channel(
    system: System,
) -> None:
    """The real resolver publishes the reply on the asking instance's channel before the Kafka
    reply, with the plan it has just cached: the miss is answered by that copy without reading
    the plan back, and the Kafka copy does not answer it twice."""
    gateway = system.gateways[1]
    agreement = await system.add_agreement(rec_registry_verdict(*fresh_principals()))
    before = await _replies_answered(system, gateway)
    served = await system.edr_query(agreement, gateway=gateway)
    assert served.status_code == 200, served.text
    assert pods_of(served) == ALICE_PODS
    after = await _replies_answered(system, gateway)
    assert after.get("redis", 0) - before.get("redis", 0) == 1
    assert after.get("kafka", 0) - before.get("kafka", 0) == 0
    assert after["plan_read"] == before["plan_read"]  # the copy carried the plan it announced


async def test_all_resolvers_stopped_503_then_ready_again_serves(system: System) -> None:
    agreement = await system.add_agreement(rec_registry_verdict(*fresh_principals()))
    for name in system.resolvers:
        await asyncio.to_thread(system.stack.stop_service, name)
    try:
        refused = await system.edr_query(agreement)
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"] == "row_filter_unavailable"
        assert "items" not in refused.json()
    finally:
        for name in system.resolvers:  # start_service waits for /readyz (partitions held)
            await asyncio.to_thread(system.stack.start_service, name, scaled(120.0))
    for name in system.resolvers:
        url = system.instance_urls()[name]
        assert (await system.http.get(f"{url}/readyz")).status_code == 200
    served = await system.edr_query(agreement)
    assert served.status_code == 200, served.text
    assert pods_of(served) == ALICE_PODS
