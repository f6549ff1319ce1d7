"""Issue 12, idle cost: a gateway fetches plan replies only while a request is pending. Its reply
partition is paused when nothing is pending and resumed before a request goes out, keeping its
position, so a miss after an idle spell still gets its reply. Real broker and Redis; the
resolver is the protocol double of dataplane_testing.gateway."""

from __future__ import annotations

import redis.asyncio as aioredis
from aiokafka import AIOKafkaProducer

from dataplane_contracts.plans import CallerIdentity, ClaimCheck
from dataplane_testing.gateway import FakeResolver, World
from query_gateway.clients.plan_client import PlanClient


def lookup(username: str) -> ClaimCheck:
    caller = CallerIdentity(sub=username, username=username)
    return ClaimCheck(handler="rec_registry", args={"column": "id"}, table="registry", caller=caller)


async def test_replies_are_fetched_only_while_a_request_is_pending(
    world: World, flushed: FakeResolver
) -> None:
    redis = aioredis.from_url(world.redis_url)
    producer = AIOKafkaProducer(bootstrap_servers=world.kafka, enable_idempotence=False)
    await producer.start()
    plans = PlanClient(world.settings(), redis, producer)
    try:
        await plans.start()
        assert plans.positioned and not plans.fetching  # nothing pending: no fetch at all
        # one miss after another, each after the partition was paused: each gets its reply
        first = await plans.resolve(lookup("name-of-user-1"))
        assert not plans.fetching
        second = await plans.resolve(lookup("name-of-user-2"))
        assert not plans.fetching
        assert (first.values, second.values) == (("pod-2",), ("pod-1", "pod-3"))
        assert len(flushed.requests) == 2
    finally:
        await plans.stop()
        await producer.stop()
        await redis.aclose()
