"""QE-10's total across replicas, against a real Redis: two replicas' shares (each its own
`ConsumerSlots` and lease set on one Redis, as two gateway processes have) admit one consumer
at most the total between them, another consumer is admitted beside it, a lease given back is
usable again (kept a moment for the consumer's next statement, still counted), a lease of a
replica that died expires by itself, and a Redis that cannot be
reached leaves the replica's own share to bound the statement (counted, never refused)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry, Counter

from dataplane_service_kit.errors import ServiceError
from query_gateway.clients.concurrency import ConsumerSlots, SharedShare

SECRET = b"s" * 32
A, B = "user\x00alice", "user\x00bob"


def _replica(redis: aioredis.Redis, total: int, lease_s: float = 30, share: int = 10) -> ConsumerSlots:
    return ConsumerSlots(share, SharedShare(redis, SECRET, total, lease_s))


async def _holding(slots: ConsumerSlots, who: str, release: asyncio.Event, entered: asyncio.Event) -> None:
    async with slots.hold(who):
        entered.set()
        await release.wait()


async def _refused(slots: ConsumerSlots, who: str) -> ServiceError:
    with pytest.raises(ServiceError) as err:
        async with slots.hold(who):
            pass
    return err.value


async def test_qe10_the_total_binds_across_replicas_and_not_across_consumers(redis_url: str) -> None:
    redis = aioredis.from_url(redis_url)
    one, two = _replica(redis, total=3), _replica(redis, total=3)
    release = asyncio.Event()
    held = []
    for slots in (one, two, one):  # three statements of alice, on both replicas
        entered = asyncio.Event()
        held.append(asyncio.create_task(_holding(slots, A, release, entered)))
        await entered.wait()
    err = await _refused(two, A)  # the fourth, on the replica holding only one of them
    assert (err.status_code, err.code) == (429, "too_many_concurrent_queries")
    assert err.headers == {"Retry-After": "1"}
    assert "across the replicas" in err.detail and "alice" not in err.detail
    assert two.running(A) == 1  # the refused statement's replica slot was given back
    async with two.hold(B):  # another consumer is not counted against alice's total
        pass
    release.set()
    await asyncio.gather(*held)
    async with one.hold(A), two.hold(A), one.hold(A):  # every lease came back (or is lent again)
        pass
    for slots in (one, two):
        await slots.shared.close()  # type: ignore[union-attr]
    assert await redis.zcard(one.shared.key(A)) == 0  # type: ignore[union-attr]
    await redis.aclose()


async def _take_calls(redis: aioredis.Redis) -> int:
    stats = await redis.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k in ("cmdstat_evalsha", "cmdstat_eval"))


async def test_qe10_a_finished_statements_lease_is_lent_again_without_a_round_trip(redis_url: str) -> None:
    """One consumer's statements one after another take one lease from Redis, not one each; the
    lease is given back KEEP_S after the last of them, and then nothing is kept or sent."""
    redis = aioredis.from_url(redis_url)
    share = SharedShare(redis, SECRET, 3, lease_s=30, keep_s=0.2)
    slots = ConsumerSlots(10, share)
    before = await _take_calls(redis)
    for _ in range(20):
        async with slots.hold(A):
            pass
    assert await _take_calls(redis) - before == 1
    assert share.kept(A) == 1 and await redis.zcard(share.key(A)) == 1  # still counted in the total
    await asyncio.sleep(0.6)
    assert share.kept(A) == 0 and await redis.zcard(share.key(A)) == 0
    assert share._sweeper is not None and share._sweeper.done()  # an idle replica runs no task
    await redis.aclose()


async def test_qe10_a_kept_lease_counts_in_the_total_until_it_is_given_back(redis_url: str) -> None:
    """The total stays exact: leases one replica keeps refuse the consumer on another for at most
    KEEP_S; after that, or once the first replica stops, the other admits it."""
    redis = aioredis.from_url(redis_url)
    one = ConsumerSlots(10, SharedShare(redis, SECRET, 2, lease_s=30, keep_s=0.3))
    two = ConsumerSlots(10, SharedShare(redis, SECRET, 2, lease_s=30, keep_s=0.3))
    async with one.hold(A), one.hold(A):
        pass
    assert (await _refused(two, A)).code == "too_many_concurrent_queries"
    await asyncio.sleep(0.8)
    async with two.hold(A), two.hold(A):
        pass
    await two.shared.close()  # type: ignore[union-attr]
    async with one.hold(A), one.hold(A):
        pass
    # the replica stops: its kept leases are given back at once
    await one.shared.close()  # type: ignore[union-attr]
    async with two.hold(A), two.hold(A):
        pass
    await two.shared.close()  # type: ignore[union-attr]
    assert await redis.zcard(two.shared.key(A)) == 0  # type: ignore[union-attr]
    await redis.aclose()


async def test_qe10_a_lease_is_not_lent_past_its_reuse_window(redis_url: str) -> None:
    """A lease lent again must outlive whichever statement holds it: past REUSE_S from its take
    it is given back at once, and the next statement takes a new one."""
    redis = aioredis.from_url(redis_url)
    share = SharedShare(redis, SECRET, 3, lease_s=30, keep_s=0.2, reuse_s=0.3)
    slots = ConsumerSlots(10, share)
    before = await _take_calls(redis)
    async with slots.hold(A):
        await asyncio.sleep(0.35)  # the statement ran past the lease's reuse window
    assert share.kept(A) == 0 and await redis.zcard(share.key(A)) == 0
    async with slots.hold(A):
        pass
    assert await _take_calls(redis) - before == 2
    await share.close()
    await redis.aclose()


async def test_qe10_the_key_names_no_consumer(redis_url: str) -> None:
    redis = aioredis.from_url(redis_url)
    slots = _replica(redis, total=2)
    async with slots.hold(A):
        keys = [k.decode() for k in await redis.keys("*")]
    assert len(keys) == 1 and "alice" not in keys[0] and keys[0].startswith("dataplane:cc:")
    await redis.aclose()


async def test_qe10_a_dead_replicas_leases_expire_by_themselves(redis_url: str) -> None:
    redis = aioredis.from_url(redis_url)
    # its statement's bound: 1 s, lent again within 0.5 s of its take: it lives 1.5 s in Redis
    dead = SharedShare(redis, SECRET, 1, lease_s=1, reuse_s=0.5)
    assert await dead.take(A) is not None  # taken, never given back: the replica died
    alive = ConsumerSlots(10, SharedShare(redis, SECRET, 1, lease_s=1, reuse_s=0.5))
    assert (await _refused(alive, A)).code == "too_many_concurrent_queries"
    await asyncio.sleep(1.0)
    assert (await _refused(alive, A)).code == "too_many_concurrent_queries"  # not before its life
    await asyncio.sleep(0.7)
    async with alive.hold(A):  # the dead replica's lease expired
        pass
    await redis.aclose()


async def test_qe10_a_total_that_cannot_be_counted_leaves_the_replicas_share(unique: str) -> None:
    unreachable = aioredis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.2)
    registry = CollectorRegistry()
    uncounted = Counter(f"uncounted_{unique}", "test", registry=registry)
    slots = ConsumerSlots(2, SharedShare(unreachable, SECRET, 1, lease_s=5, uncounted=uncounted))
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(slots.hold(A))
        await stack.enter_async_context(slots.hold(A))  # past the total: it was not counted
        assert (await _refused(slots, A)).detail.endswith("running; retry when one has finished")
    assert registry.get_sample_value(f"uncounted_{unique}_total") == 2
    assert slots.running(A) == 0
    await unreachable.aclose()
