"""GS-14 (issue 15): a token bucket per consumer and dataset in Redis, shared by every replica.
The bucket's arithmetic, the script on a real Valkey server (burst, refusal with the wait, all or
nothing across datasets, refill, the key's TTL, no consumer id in clear), and the gateway's routes
over it: `429 rate_limited` with `Retry-After` for the consumer over its rate on the normal and
EDR paths — two gateways over one Redis share the bucket — another consumer untouched, the bucket
refilled after the wait, and `503 rate_limit_unavailable` (never rows) while Redis cannot answer;
each refusal with its metric and its access record."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from dataplane_contracts.catalogue import DatasetEntry, RateLimitSpec
from dataplane_local import infra
from dataplane_local.doubles.ds_connector import DsConnectorDouble
from dataplane_local.procs import paused
from dataplane_testing.faults import coded
from dataplane_testing.gateway import AGREEMENT, CACHE_SECRET, CATALOGUE, World, ds_policy, running_gateway
from dataplane_testing.metrics import scrape
from dataplane_testing.metrics import series as metric
from dataplane_testing.polling import wait_for
from query_gateway.clients.rate_limit import (
    BUCKET_SCRIPT,
    Limit,
    RateLimiter,
    default_limit,
    limit_of,
    refill_wait,
    retry_after,
)

# two tokens held, one added every two seconds: the third quick read is refused for about 2 s
LIMITED = """
  - id: limited_stats
    table: public.stats
    access_level: open
    expose: true
    dataspace_expose: true
    rate_limit: {per_second: 0.5, burst: 2}
    row_filters:
      person: {handler: allow_all, binds: person}
      organization: {handler: allow_all, binds: organization}
"""
LIMITED_SQL = {"sql": "SELECT id, label FROM limited_stats ORDER BY id"}
FREE_SQL = {"sql": "SELECT id, label FROM stats ORDER BY id"}


def limited_catalogue(directory: Path) -> str:
    path = directory / "catalogue-limited.yaml"
    path.write_text(CATALOGUE.read_text().rstrip("\n") + "\n" + LIMITED)
    return str(path)


def audit_records(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [r.msg for r in caplog.records if r.name == "dataplane.audit" and isinstance(r.msg, dict)]


def user(world: World, sub: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {world.user_token(sub)}"}


async def refused_count(client: httpx.AsyncClient, status: int, code: str) -> float:
    text = await scrape(client)
    return metric(text, "query_gateway_requests_total", route="/query", status=str(status), code=code)


def entry(dataset_id: str, spec: RateLimitSpec | None) -> DatasetEntry:
    return DatasetEntry(id=dataset_id, table="t", rate_limit=spec)


# ---------------------------------------------------------------------------- arithmetic
def test_gs14_the_default_limit_is_the_operators_and_burst_defaults_to_a_seconds_worth() -> None:
    assert default_limit(0, 10) is None  # 0: the operator chose no default limit
    assert default_limit(5, 0) == Limit(5, 5)
    assert default_limit(0.2, 0) == Limit(0.2, 1)  # at least one token
    assert default_limit(5, 20) == Limit(5, 20)
    own = entry("a", RateLimitSpec(per_second=1, burst=3))
    assert limit_of(own, Limit(100, 100)) == Limit(1, 3)  # the catalogue's override wins
    assert limit_of(entry("b", None), Limit(100, 100)) == Limit(100, 100)
    assert limit_of(entry("b", None), None) is None


def test_gs14_refill_wait_and_retry_after_round_up_to_a_token() -> None:
    assert refill_wait(1.0, 2) == 0
    assert refill_wait(0.0, 0.5) == 2.0
    assert refill_wait(0.75, 2) == 0.125
    assert retry_after(1) == "1"  # never 0: a client told 0 would retry at once
    assert retry_after(1000) == "1"
    assert retry_after(1001) == "2"
    assert retry_after(2000) == "2"


def test_gs14_the_bucket_key_never_carries_the_consumer() -> None:
    limiter = RateLimiter(aioredis.Redis(), CACHE_SECRET.encode(), None)
    key = limiter.bucket_key("did", "did:web:consumer.example", "stats")
    assert "consumer" not in key and key.startswith("dataplane:rl:{") and key.endswith("}:stats")
    # the normal path's subject and a DID of the same text are different buckets
    assert key != limiter.bucket_key("sub", "did:web:consumer.example", "stats")
    assert limiter.bucket_key("sub", None, "stats") == limiter.bucket_key("sub", None, "stats")


# ---------------------------------------------------------------------------- the script
@pytest.fixture
async def redis(redis_server_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.from_url(redis_server_url)
    yield client
    await client.aclose()


async def test_gs14_script_takes_the_burst_then_refuses_with_the_wait(redis: aioredis.Redis) -> None:
    script = redis.register_script(BUCKET_SCRIPT)
    key = f"dataplane:rl:{{test-{uuid.uuid4().hex}}}:a"
    assert [int(await script(keys=[key], args=["0.5", "2"])) for _ in range(2)] == [0, 0]
    wait_ms = int(await script(keys=[key], args=["0.5", "2"]))
    assert 1_500 < wait_ms <= 2_000  # one token at 0.5/s: up to 2 s away
    ttl = await redis.pttl(key)
    assert 0 < ttl <= 5_000  # burst / rate + 1 s: an idle bucket goes, as a full one would read


async def test_gs14_script_is_all_or_nothing_across_datasets(redis: aioredis.Redis) -> None:
    script = redis.register_script(BUCKET_SCRIPT)
    tag = f"test-{uuid.uuid4().hex}"
    roomy, tight = f"dataplane:rl:{{{tag}}}:roomy", f"dataplane:rl:{{{tag}}}:tight"
    assert int(await script(keys=[roomy, tight], args=["100", "100", "0.1", "1"])) == 0
    assert int(await script(keys=[roomy, tight], args=["100", "100", "0.1", "1"])) > 0
    # the refusal took nothing from the roomy bucket: 99 tokens left, not 98
    held = float((await redis.hget(roomy, "t")) or 0)
    assert 98.9 < held < 100


async def test_gs14_script_refills_at_the_rate(redis: aioredis.Redis) -> None:
    script = redis.register_script(BUCKET_SCRIPT)
    key = f"dataplane:rl:{{test-{uuid.uuid4().hex}}}:a"
    assert int(await script(keys=[key], args=["10", "1"])) == 0
    wait_ms = int(await script(keys=[key], args=["10", "1"]))
    assert 0 < wait_ms <= 100
    await asyncio.sleep(wait_ms / 1000 + 0.05)
    assert int(await script(keys=[key], args=["10", "1"])) == 0


async def test_gs14_a_flushed_script_cache_is_loaded_again(redis: aioredis.Redis) -> None:
    limiter = RateLimiter(redis, CACHE_SECRET.encode(), None)
    await redis.script_flush()
    spec = RateLimitSpec(per_second=1, burst=5)
    await limiter.admit("sub", f"s-{uuid.uuid4().hex}", [entry("a", spec)])  # NOSCRIPT, then EVAL


# ---------------------------------------------------------------------------- the routes
@pytest.fixture(scope="module")
async def replicas(
    world: World, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient]]:
    """Two gateways over one Redis and one catalogue with a limited dataset."""
    settings = world.settings(catalogue_path=limited_catalogue(tmp_path_factory.mktemp("limited")))
    async with running_gateway(settings) as a, running_gateway(settings) as b:
        yield a, b


async def test_gs14_a_consumer_over_its_rate_gets_429_from_either_replica_then_the_bucket_refills(
    replicas: tuple[httpx.AsyncClient, httpx.AsyncClient], world: World, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dataplane.audit")
    a, b = replicas
    over, other = user(world, f"over-{uuid.uuid4().hex}"), user(world, f"other-{uuid.uuid4().hex}")
    before = [await refused_count(gw, 429, "rate_limited") for gw in (a, b)]
    served = [await gw.post("/query", json=LIMITED_SQL, headers=over) for gw in (a, b)]
    assert [r.status_code for r in served] == [200, 200]
    refusals = [await gw.post("/query", json=LIMITED_SQL, headers=over) for gw in (a, b)]
    for r in refusals:
        assert coded(r) == (429, "rate_limited"), r.text
        assert r.headers["Retry-After"] in ("1", "2") and r.headers["X-Request-ID"]
        assert "over-" not in r.text and "items" not in r.json()
    # another consumer, and the same consumer's unlimited dataset, are untouched
    assert (await b.post("/query", json=LIMITED_SQL, headers=other)).status_code == 200
    assert (await a.post("/query", json=FREE_SQL, headers=over)).status_code == 200
    # one refusal counted by each replica: every app has a registry of its own
    assert [await refused_count(gw, 429, "rate_limited") for gw in (a, b)] == [n + 1 for n in before]
    denied = [rec for rec in audit_records(caplog) if rec["reason"] == "rate_limited"]
    assert [(rec["outcome"], rec["resource"]) for rec in denied] == [("error", "limited_stats")] * 2
    await asyncio.sleep(int(refusals[-1].headers["Retry-After"]))
    assert (await b.post("/query", json=LIMITED_SQL, headers=over)).status_code == 200


async def test_gs14_the_edr_consumer_is_limited_by_its_did_before_ds_is_asked(
    replicas: tuple[httpx.AsyncClient, httpx.AsyncClient], world: World, ds: DsConnectorDouble
) -> None:
    a, b = replicas
    ds.set_policy(ds_policy([{"dataset_id": "limited_stats"}, {"dataset_id": "stats"}]))
    edr = {"Authorization": f"Bearer {world.edr()}", "Edc-Contract-Agreement-Id": AGREEMENT}
    answers = [await gw.post("/query", json=LIMITED_SQL, headers=edr) for gw in (a, b, a, b)]
    codes = [coded(r) if r.status_code != 200 else (200, "") for r in answers]
    # only this test reads limited_stats as the consumer DID: its burst of two, then refused by both
    assert codes == [(200, ""), (200, ""), (429, "rate_limited"), (429, "rate_limited")], codes
    asked = len(ds.calls("authorize"))
    refused = await b.post("/query", json=LIMITED_SQL, headers=edr)
    assert coded(refused) == (429, "rate_limited") and "Retry-After" in refused.headers
    assert len(ds.calls("authorize")) == asked  # refused before the connector was asked
    # the normal path's caller is another consumer
    other = await a.post("/query", json=LIMITED_SQL, headers=user(world, uuid.uuid4().hex))
    assert other.status_code == 200


async def test_gs14_redis_unreachable_refuses_limited_reads_503_and_serves_the_rest(
    world: World, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dataplane.audit")
    redis = infra.start_redis(tmp_path / "redis")
    try:
        settings = world.settings(
            catalogue_path=limited_catalogue(tmp_path),
            redis_url=redis.url,
            redis_socket_timeout_seconds=1.0,
        )
        async with running_gateway(settings) as client:
            headers = user(world, f"u-{uuid.uuid4().hex}")
            assert (await client.post("/query", json=LIMITED_SQL, headers=headers)).status_code == 200
            with paused(redis.pid):
                r = await client.post("/query", json=LIMITED_SQL, headers=headers)
                assert coded(r) == (503, "rate_limit_unavailable") and "items" not in r.json()
                # a dataset without a limit needs no bucket: served
                assert (await client.post("/query", json=FREE_SQL, headers=headers)).status_code == 200
                assert await refused_count(client, 503, "rate_limit_unavailable") >= 1
            [rec] = [rec for rec in audit_records(caplog) if rec["reason"] == "rate_limit_unavailable"]
            assert (rec["outcome"], rec["resource"]) == ("error", "limited_stats")

            async def served() -> bool:
                return (await client.post("/query", json=LIMITED_SQL, headers=headers)).status_code == 200

            await wait_for(served, 30, "served again once Redis answers")
    finally:
        redis.stop()
