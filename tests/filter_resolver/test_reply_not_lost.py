"""The consumer's ack policy, through a real broker and a real resolver process: a request whose
reply could not be published is not committed, is read again, and is answered once the reply
topic accepts the reply — it is never lost.

The broker refusing the reply is a real refusal: a Tansu broker of this test's own, started with
a schema registry whose schema for the reply topic no `PlanResolved` matches (a topic that does
not exist cannot stand in for it: Tansu creates topics on first use and has no switch to stop
that). Removing the schema file lifts the refusal without restarting anything."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from redis.asyncio import Redis

from dataplane_contracts.events import PlanResolved
from dataplane_local.infra import start_kafka
from dataplane_testing.polling import eventually
from dataplane_testing.resolver import (
    CLIENT_ID,
    CLIENT_SECRET,
    PARTITIONS,
    claim,
    gateway,
    module_topics,
    person,
    put_claim,
    read_plan,
    resolver_env,
    start_resolver,
)
from dataplane_testing.topics import make_topics
from filter_resolver.settings import GROUP_ID

pytestmark = pytest.mark.e2e

# what the reply topic's schema demands of every record's value: a field no reply has
REFUSING_SCHEMA = {
    "type": "object",
    "properties": {"value": {"type": "object", "required": ["never_in_a_reply"]}},
}


async def test_reply_that_could_not_be_published_is_not_committed_and_is_answered_later(
    tmp_path: Path, redis_url: str, fresh_doubles: Any, unique: str
) -> None:
    specs, request_topic, reply_topic = module_topics(unique)
    schema_dir = tmp_path / "kafka" / "schema"
    schema_dir.mkdir(parents=True)
    refusal = schema_dir / f"{reply_topic}.json"
    refusal.write_text(json.dumps(REFUSING_SCHEMA))
    broker = start_kafka(tmp_path / "kafka", schema_dir=schema_dir)
    resolver = None
    redis = Redis.from_url(redis_url)
    try:
        await make_topics(broker.url, specs)
        resolver = start_resolver(
            resolver_env(
                broker.url,
                redis_url,
                request_topic,
                CELINE_OIDC_BASE_URL=fresh_doubles.issuer.base_url,
                CELINE_OIDC_CLIENT_ID=CLIENT_ID,
                CELINE_OIDC_CLIENT_SECRET=CLIENT_SECRET,
                RESOLVER_RETRY_BASE_MS="5",
            ),
            tmp_path,
            "resolver",
        )
        assert await eventually(resolver.ready, timeout=60, interval=0.2), resolver.stderr()[-3000:]
        fresh_doubles.endpoint.reset((200, ["m-1", "m-2"]))
        args = {"column": "meter_id", "url": fresh_doubles.endpoint_url + "/allowed"}
        check = claim("http_in_list", args, caller=person(fresh_doubles.issuer, "al"))
        request = await put_claim(redis, check, reply_topic=reply_topic, reply_partition=0, deadline_s=120)
        tps = [TopicPartition(request_topic, p) for p in range(PARTITIONS)]
        # a group member that never subscribes reads the group's committed offsets without joining
        offsets = AIOKafkaConsumer(bootstrap_servers=broker.url, group_id=GROUP_ID, enable_auto_commit=False)
        await offsets.start()
        try:
            async with gateway(broker.url, request_topic, reply_topic) as gw:
                await gw.send(request)

                # resolved, its reply refused, and read again: the offset was not committed
                async def read_twice() -> bool:
                    return await resolver.metric("filter_resolver_resolutions_total") >= 2

                assert await eventually(read_twice, timeout=30), resolver.stderr()[-3000:]
                assert [await offsets.committed(tp) or 0 for tp in tps] == [0] * PARTITIONS
                assert request.correlation_id not in gw.replies
                assert "plan_reply_failed" in resolver.stderr()

                refusal.unlink()  # the reply topic takes replies again
                record = await gw.reply(request.correlation_id, timeout=60)
                reply = PlanResolved.model_validate_json(record.value or b"")
                assert (reply.outcome, reply.cache_key) == ("cached", request.cache_key)
                assert (await read_plan(redis, reply)).values == ("m-1", "m-2")
                # the endpoint was asked once: the readings after the first were answered from
                # the plan it cached (the claim check had been taken by the first)
                assert len(fresh_doubles.endpoint.calls()) == 1

                async def committed() -> bool:
                    ends = await offsets.end_offsets(tps)
                    return [await offsets.committed(tp) or 0 for tp in tps] == [ends[tp] for tp in tps]

                assert await eventually(committed, timeout=30)
        finally:
            await offsets.stop()
    finally:
        if resolver is not None:
            resolver.stop()
        await redis.aclose()
        broker.stop()
