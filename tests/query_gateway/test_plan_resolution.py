"""Lookup handlers through the filter-resolver protocol (ARCHITECTURE "Two phases"): claim check in
Redis, a PlanRequest carrying nothing personal, replies read from this instance's partition, the
cached and one-shot outcomes, coalescing, the in-process tier, and 503 row_filter_unavailable.

The resolver here is a protocol double: it consumes dataplane.plan.requests and answers by the
contract; the real resolver is tested with its own service."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx
import pytest
import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from gateway_support import World

from dataplane_contracts.events import PlanRequest, PlanResolved
from dataplane_contracts.plans import ClaimCheck, Plan, redis_claim_key, redis_one_shot_key, redis_plan_key
from dataplane_contracts.topics import PLAN_REQUESTS

OWNED = {"name-of-user-1": ["pod-2"], "name-of-user-2": ["pod-1", "pod-3"]}


@dataclass
class FakeResolver:
    mode: str = "cached"  # cached | one_shot | error | silent
    requests: list[bytes] = field(default_factory=list)
    claims: list[ClaimCheck] = field(default_factory=list)


@pytest.fixture(scope="module")
async def resolver(world: World) -> AsyncIterator[FakeResolver]:
    state = FakeResolver()
    redis = aioredis.from_url(world.redis_url)
    producer = AIOKafkaProducer(bootstrap_servers=world.kafka, enable_idempotence=False)
    consumer = AIOKafkaConsumer(bootstrap_servers=world.kafka, group_id=None, fetch_max_wait_ms=10)
    await producer.start()
    await consumer.start()
    tps = [TopicPartition(PLAN_REQUESTS, p) for p in sorted(await producer.partitions_for(PLAN_REQUESTS))]
    consumer.assign(tps)
    await consumer.seek_to_end(*tps)
    for tp in tps:
        await consumer.position(tp)

    async def answer(raw: bytes) -> None:
        state.requests.append(raw)
        req = PlanRequest.model_validate_json(raw)
        claim = ClaimCheck.model_validate_json(await redis.getdel(redis_claim_key(req.claim_check_id)))
        state.claims.append(claim)
        if state.mode == "silent":
            return
        username = claim.caller.username if claim.caller else None
        plan = Plan.among(str(claim.args["column"]), OWNED.get(username or "", []), label="pod keys")
        reply: PlanResolved
        if state.mode == "error":
            reply = PlanResolved(
                correlation_id=req.correlation_id,
                cache_key=req.cache_key,
                outcome="error",
                error_code="row_filter_unavailable",
                error_detail="registry unreachable",
            )
        elif state.mode == "one_shot":
            once = uuid.uuid4().hex
            await redis.set(redis_one_shot_key(once), plan.model_dump_json(), ex=30)
            reply = PlanResolved(
                correlation_id=req.correlation_id,
                cache_key=req.cache_key,
                outcome="one_shot",
                one_shot_id=once,
            )
        else:
            await redis.set(redis_plan_key(req.cache_key), plan.model_dump_json(), ex=60)
            reply = PlanResolved(correlation_id=req.correlation_id, cache_key=req.cache_key, outcome="cached")
        await producer.send_and_wait(
            req.reply_topic, reply.model_dump_json().encode(), partition=req.reply_partition
        )

    async def loop() -> None:
        while True:
            batches = await consumer.getmany(timeout_ms=200)
            for records in batches.values():
                for record in records:
                    await answer(record.value)

    task = asyncio.create_task(loop())
    yield state
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await consumer.stop()
    await producer.stop()
    await redis.aclose()


async def query(
    client: httpx.AsyncClient, token: str, sql: str = "SELECT id FROM registry ORDER BY id"
) -> httpx.Response:
    return await client.post("/query", json={"sql": sql}, headers={"Authorization": f"Bearer {token}"})


@pytest.fixture
async def flushed(world: World, resolver: FakeResolver) -> FakeResolver:
    redis = aioredis.from_url(world.redis_url)
    for key in [k async for k in redis.scan_iter("dataplane:*")]:
        await redis.delete(key)
    await redis.aclose()
    resolver.mode = "cached"
    resolver.requests.clear()
    resolver.claims.clear()
    return resolver


async def test_a_lookup_plan_is_resolved_once_then_served_from_the_cache(
    world: World, flushed: FakeResolver
) -> None:
    from gateway_support import running_gateway

    async with running_gateway(world.settings()) as client:
        token = world.user_token("user-1")
        r = await query(client, token)
        assert [row["id"] for row in r.json()["items"]] == [2], r.text
        again = await query(client, token)
        assert [row["id"] for row in again.json()["items"]] == [2]
    assert len(flushed.requests) == 1  # the second read came from the in-process tier
    # a second gateway reads the shared Redis tier: still no new request
    async with running_gateway(world.settings()) as client:
        assert [row["id"] for row in (await query(client, token)).json()["items"]] == [2]
    assert len(flushed.requests) == 1


async def test_the_plan_request_carries_nothing_personal(world: World, flushed: FakeResolver) -> None:
    from gateway_support import running_gateway

    token = world.user_token("user-2")
    async with running_gateway(world.settings()) as client:
        r = await query(client, token)
    assert [row["id"] for row in r.json()["items"]] == [1, 3]
    [raw] = flushed.requests
    assert set(json.loads(raw)) == {
        "event_id", "occurred_at", "schema_version", "cache_key", "claim_check_id",
        "correlation_id", "reply_topic", "reply_partition", "deadline",
    }  # fmt: skip
    for personal in ("user-2", "name-of-user-2", "mail.example", token.split(".")[1], "registry"):
        assert personal not in raw.decode()
    [claim] = flushed.claims
    assert claim.handler == "rec_registry" and claim.principals is None  # self-service
    assert claim.caller is not None and claim.caller.token == token


async def test_a_one_shot_plan_is_read_once(world: World, flushed: FakeResolver) -> None:
    from gateway_support import running_gateway

    flushed.mode = "one_shot"
    async with running_gateway(world.settings()) as client:
        r = await query(client, world.user_token("user-1"))
        assert [row["id"] for row in r.json()["items"]] == [2]
        await query(client, world.user_token("user-1"))
    assert len(flushed.requests) == 2  # a one-shot plan is never cached


async def test_identical_misses_in_flight_coalesce(world: World, flushed: FakeResolver) -> None:
    from gateway_support import running_gateway

    token = world.user_token("user-2")
    async with running_gateway(world.settings()) as client:
        answers = await asyncio.gather(*(query(client, token) for _ in range(4)))
    assert [[row["id"] for row in a.json()["items"]] for a in answers] == [[1, 3]] * 4
    assert len(flushed.requests) == 1


async def test_a_resolver_error_is_503_row_filter_unavailable(world: World, flushed: FakeResolver) -> None:
    from gateway_support import running_gateway

    flushed.mode = "error"
    async with running_gateway(world.settings()) as client:
        r = await query(client, world.user_token("user-1"))
    assert r.status_code == 503 and r.json()["error"] == "row_filter_unavailable"


async def test_no_reply_before_the_deadline_is_503_never_no_filter(
    world: World, flushed: FakeResolver
) -> None:
    from gateway_support import running_gateway

    flushed.mode = "silent"
    async with running_gateway(world.settings(row_filters_resolve_timeout_ms=500)) as client:
        r = await query(client, world.user_token("user-1"))
    assert r.status_code == 503 and r.json()["error"] == "row_filter_unavailable"
    assert r.json()["detail"] == "row filter resolution timed out"


async def test_the_gateway_is_ready_once_its_reply_partition_is_positioned(world: World) -> None:
    from gateway_support import running_gateway

    async with running_gateway(world.settings()) as client:
        r = await client.get("/readyz")
    assert r.status_code == 200, r.text
