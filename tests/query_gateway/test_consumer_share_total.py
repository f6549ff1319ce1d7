"""QE-10's total across replicas, against a real Redis: two replicas' shares (each its own
`ConsumerSlots` and lease set on one Redis, as two gateway processes have) admit one consumer
at most the total between them, another consumer is admitted beside it, a lease given back is
usable again, a lease of a replica that died expires by itself, and a Redis that cannot be
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
    async with one.hold(A), two.hold(A), one.hold(A):  # every lease came back
        pass
    assert await redis.zcard(one.shared.key(A)) == 0  # type: ignore[union-attr]
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
    dead = SharedShare(redis, SECRET, 1, lease_s=1)  # its statement's bound: 1 s
    assert await dead.take(A) is not None  # taken, never given back: the replica died
    alive = ConsumerSlots(10, SharedShare(redis, SECRET, 1, lease_s=1))
    assert (await _refused(alive, A)).code == "too_many_concurrent_queries"
    await asyncio.sleep(1.2)
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
