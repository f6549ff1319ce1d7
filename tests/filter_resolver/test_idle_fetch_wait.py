"""Issue 12, idle cost: the request consumer lengthens its fetch wait once no request has come for
RESOLVER_IDLE_AFTER_MS and shortens it as soon as one arrives; a request sent while it is idle is
still answered. Through the real broker, Redis and the http_in_list endpoint double, with the
consumer in this process (so its wait in force can be read). The wait in force changes only when
aiokafka took the new value (`set_fetch_wait`), so this also pins that this aiokafka's fetcher
still reads its wait per request: one that moved it fails here instead of silently costing CPU."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis

from dataplane_contracts.events import PlanResolved
from dataplane_testing.polling import eventually
from dataplane_testing.resolver import (
    claim,
    gateway,
    make_settings,
    module_topics,
    person,
    put_claim,
    read_plan,
)
from dataplane_testing.topics import make_topics
from filter_resolver.app import open_runtime
from filter_resolver.consumer import PlanRequestConsumer
from filter_resolver.metrics import Metrics

BUSY_MS, IDLE_MS = 10, 300


@pytest.fixture
async def consumer(
    kafka_bootstrap: str, redis_url: str, fresh_doubles: Any, unique: str
) -> AsyncIterator[tuple[PlanRequestConsumer, str, str]]:
    specs, request_topic, reply_topic = module_topics(f"idle-{unique}")
    await make_topics(kafka_bootstrap, specs)
    settings = make_settings(
        kafka_bootstrap_servers=kafka_bootstrap,
        kafka_enable_idempotence=False,
        kafka_rpc_fetch_max_wait_ms=BUSY_MS,
        resolver_idle_fetch_max_wait_ms=IDLE_MS,
        resolver_idle_after_ms=1_500,
        redis_url=redis_url,
        celine_oidc_base_url=fresh_doubles.issuer.base_url,
        plan_requests_topic=request_topic,
        resolver_group_id=f"resolver-idle-{unique}",
    )
    metrics = Metrics()
    runtime = open_runtime(settings, metrics, [])
    runtime.consumer = PlanRequestConsumer(settings, runtime.resolver, metrics)
    runtime.consumer.start()
    try:
        yield runtime.consumer, request_topic, reply_topic
    finally:
        await runtime.aclose()


async def test_an_idle_consumer_waits_long_and_answers_the_next_request_with_the_short_wait(
    consumer: tuple[PlanRequestConsumer, str, str], kafka_bootstrap: str, redis_url: str, fresh_doubles: Any
) -> None:
    member, request_topic, reply_topic = consumer

    async def ready() -> bool:
        return member.ready()

    async def idle() -> bool:
        return member.fetch_wait_ms == IDLE_MS

    assert await eventually(ready, timeout=60, interval=0.1)
    assert await eventually(idle, timeout=30, interval=0.05)

    fresh_doubles.endpoint.reset((200, ["m-1"]))
    args = {"column": "meter_id", "url": fresh_doubles.endpoint_url + "/allowed"}
    redis = Redis.from_url(redis_url)
    try:
        request = await put_claim(
            redis, claim("http_in_list", args, caller=person(fresh_doubles.issuer, "idle")),
            reply_topic=reply_topic, reply_partition=0,
        )  # fmt: skip
        async with gateway(kafka_bootstrap, request_topic, reply_topic) as gw:
            reply = await gw.ask(request)
            # answered while the short wait is back in force: requests are coming
            assert member.fetch_wait_ms == BUSY_MS
        assert isinstance(reply, PlanResolved) and reply.outcome == "cached"
        assert (await read_plan(redis, reply)).values == ("m-1",)
    finally:
        await redis.aclose()
    # and quiet again: the long wait once more
    assert await eventually(idle, timeout=30, interval=0.05)
