"""Lookup handlers through the filter-resolver protocol (docs/row-filters.md, "Two phases"): claim check in
Redis, a PlanRequest carrying nothing personal, replies read from this instance's partition, the
cached and one-shot outcomes, coalescing, the in-process tier, and 503 row_filter_unavailable.

The resolver here is a protocol double: it consumes dataplane.plan.requests and answers by the
contract; the real resolver is tested with its own service."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import httpx

from dataplane_local import infra
from dataplane_testing.gateway import FakeResolver, World


async def query(
    client: httpx.AsyncClient, token: str, sql: str = "SELECT id FROM registry ORDER BY id"
) -> httpx.Response:
    return await client.post("/query", json={"sql": sql}, headers={"Authorization": f"Bearer {token}"})


async def test_a_lookup_plan_is_resolved_once_then_served_from_the_cache(
    world: World, flushed: FakeResolver
) -> None:
    from dataplane_testing.gateway import running_gateway

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
    from dataplane_testing.gateway import running_gateway

    token = world.user_token("user-2")
    async with running_gateway(world.settings()) as client:
        r = await query(client, token)
    assert [row["id"] for row in r.json()["items"]] == [1, 3]
    [raw] = flushed.requests
    assert set(json.loads(raw)) == {
        "event_id", "occurred_at", "schema_version", "cache_key", "claim_check_id",
        "correlation_id", "reply_topic", "reply_partition", "deadline", "reply_channel",
    }  # fmt: skip
    # the early-reply channel names this instance by a random id, nothing of the caller
    assert re.fullmatch(r"dataplane:plan-replies:[0-9a-f]{32}", json.loads(raw)["reply_channel"])
    for personal in ("user-2", "name-of-user-2", "mail.example", token.split(".")[1], "registry"):
        assert personal not in raw.decode()
    [claim] = flushed.claims
    assert claim.handler == "rec_registry" and claim.principals is None  # self-service
    assert claim.caller is not None and claim.caller.token == token


async def test_a_one_shot_plan_is_read_once(world: World, flushed: FakeResolver) -> None:
    from dataplane_testing.gateway import running_gateway

    flushed.mode = "one_shot"
    async with running_gateway(world.settings()) as client:
        r = await query(client, world.user_token("user-1"))
        assert [row["id"] for row in r.json()["items"]] == [2]
        await query(client, world.user_token("user-1"))
    assert len(flushed.requests) == 2  # a one-shot plan is never cached


async def test_identical_misses_in_flight_coalesce(world: World, flushed: FakeResolver) -> None:
    from dataplane_testing.gateway import running_gateway

    token = world.user_token("user-2")
    # four at once of one user: past QE-10's default share (tested on its own)
    async with running_gateway(
        world.settings(query_max_concurrent_per_consumer=4, query_max_concurrent_per_consumer_total=4)
    ) as client:
        answers = await asyncio.gather(*(query(client, token) for _ in range(4)))
    assert [[row["id"] for row in a.json()["items"]] for a in answers] == [[1, 3]] * 4
    assert len(flushed.requests) == 1


async def test_a_resolver_error_is_503_row_filter_unavailable(world: World, flushed: FakeResolver) -> None:
    from dataplane_testing.gateway import running_gateway

    flushed.mode = "error"
    async with running_gateway(world.settings()) as client:
        r = await query(client, world.user_token("user-1"))
    assert r.status_code == 503 and r.json()["error"] == "row_filter_unavailable"


async def test_no_reply_before_the_deadline_is_503_never_no_filter(
    world: World, flushed: FakeResolver
) -> None:
    from dataplane_testing.gateway import running_gateway

    flushed.mode = "silent"
    async with running_gateway(world.settings(row_filters_resolve_timeout_ms=500)) as client:
        r = await query(client, world.user_token("user-1"))
    assert r.status_code == 503 and r.json()["error"] == "row_filter_unavailable"
    assert r.json()["detail"] == "row filter resolution timed out"


async def test_the_gateway_is_ready_once_its_reply_partition_is_positioned(world: World) -> None:
    from dataplane_testing.gateway import running_gateway

    async with running_gateway(world.settings()) as client:
        r = await client.get("/readyz")
    assert r.status_code == 200, r.text


async def test_redis_down_is_503_row_filter_unavailable_never_no_filter(
    world: World, flushed: FakeResolver, tmp_path: Path
) -> None:
    """Error table: the plan cache tier unreachable fails closed, before anything is asked."""
    from dataplane_testing.gateway import running_gateway

    redis = infra.start_redis(tmp_path / "redis")
    try:
        async with running_gateway(world.settings(redis_url=redis.url)) as client:
            redis.stop()
            r = await query(client, world.user_token("user-2"))
            public = await client.post("/query", json={"sql": "SELECT id FROM stats ORDER BY id"})
    finally:
        redis.stop()
    assert r.status_code == 503, r.text
    assert r.json() == {
        "type": "urn:dataplane:error:row_filter_unavailable",
        "title": "Row filter unavailable",
        "status": 503,
        "error": "row_filter_unavailable",
        "detail": "plan cache unavailable",
    }
    assert flushed.requests == []  # refused at the cache tier: no plan was requested either
    # losing Redis loses only the cache of lookups: a dataset needing no lookup is still served
    assert [row["id"] for row in public.json()["items"]] == [1, 2]
