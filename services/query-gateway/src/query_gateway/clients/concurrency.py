"""QE-10: a consumer's share of the datasets pool. Each consumer may have at most
QUERY_MAX_CONCURRENT_PER_CONSUMER statements running on one replica at once, and at most
QUERY_MAX_CONCURRENT_PER_CONSUMER_TOTAL across every replica; one more is answered
`429 too_many_concurrent_queries` with `Retry-After` at once, instead of waiting for a connection
its own slow statements hold. So one consumer flooding slow statements leaves the rest of the
pool to everyone else (docs/gateway.md).

The replica's share is counted in this process: it bounds what one consumer holds of this
replica's pool, which is what the pool's wait needs, and it needs no store. The total is a set of
leases in Redis, where the rate limiter's buckets live: one per running statement, each expiring
by itself after the longest a statement can hold a connection, so a replica that dies holding
leases gives them back. Nothing leaks when the share is exceeded, so a total that cannot be
counted (Redis down or slow past SHARED_TIMEOUT_S) does not refuse the statement: the replica's
own share still bounds the consumer, the miss is counted and logged, and readiness names Redis
degraded (docs/faults.md). The keys are the same kind-tagged identities the rate limiter uses,
in memory as they are and in Redis only as an HMAC; never logged.

A lease a statement has finished with is kept by the replica for KEEP_S and lent to the same
consumer's next statement without a round trip (issue 30: taking and giving back were two Redis
round trips per request, a third of the admission's CPU). The total stays exact: a kept lease is
still in Redis and counts there. What it changes: a consumer whose statements move from one
replica to another may be refused by the second for up to KEEP_S after the first finished them.
A lease is taken for REUSE_S longer than a statement can last and lent only within REUSE_S of
being taken, so whichever statement holds it, it outlives that statement; a replica that dies
holding leases leaves them to expire REUSE_S later than before."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import math
import os
import time
from collections.abc import AsyncIterator

import redis.asyncio as aioredis
from prometheus_client import Counter
from redis.exceptions import RedisError

from dataplane_contracts.plans import REDIS_PREFIX
from dataplane_service_kit.errors import ServiceError
from dataplane_service_kit.logs import get_logger

log = get_logger(__name__)

RETRY_AFTER_S = "1"
# a finished statement's lease is lent again for this long (a closed-loop client's next request
# comes within milliseconds), then given back: the most another replica waits for it
KEEP_S = 0.25
# a lease is lent again only this long after it was taken (its life in Redis is this much longer)
REUSE_S = 5.0
# a total not counted within this is skipped for the statement (the replica's share holds)
SHARED_TIMEOUT_S = 0.25

# KEYS[1]: the consumer's leases, a sorted set of lease id -> expiry (ms, Redis's clock).
# ARGV: the total, the lease's life in ms, the lease id. 1 = taken, 0 = the total is reached.
TAKE_SCRIPT = """
local now = redis.call('TIME')
local t = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', t)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then
  return 0
end
redis.call('ZADD', KEYS[1], t + tonumber(ARGV[2]), ARGV[3])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
return 1
"""


def _refused(limit: int, where: str) -> ServiceError:
    return ServiceError(
        "too_many_concurrent_queries",
        f"this consumer already has {limit} queries running{where}; retry when one has finished",
        headers={"Retry-After": RETRY_AFTER_S},
    )


class SharedShare:
    """A consumer's statements running on every replica, as leases in Redis; the leases this
    replica's statements finished with are kept a moment for the same consumer's next ones."""

    def __init__(
        self,
        redis: aioredis.Redis,
        secret: bytes,
        total: int,
        lease_s: float,
        uncounted: Counter | None = None,
        *,
        keep_s: float = KEEP_S,
        reuse_s: float = REUSE_S,
    ) -> None:
        self._redis = redis
        self._script = redis.register_script(TAKE_SCRIPT)  # EVALSHA, loaded again on NOSCRIPT
        self._secret = secret
        self.total = total
        self._keep_s = keep_s
        self._reuse_s = reuse_s
        self._life_ms = max(1000, math.ceil((lease_s + reuse_s) * 1000))
        self._uncounted = uncounted
        # who -> the leases kept for it: (lease id, lendable until, given back at), monotonic; a
        # lease is kept only while it stays lendable past KEEP_S, so the second is the earlier
        self._kept: dict[str, list[tuple[str, float, float]]] = {}
        # lease id -> until when it may be lent again (monotonic), for the leases out now
        self._lendable: dict[str, float] = {}
        self._due: dict[str, list[str]] = {}  # who -> kept leases to give back at the next sweep
        self._sweeper: asyncio.Task[None] | None = None

    def key(self, who: str) -> str:
        digest = hmac.new(self._secret, who.encode(), hashlib.sha256).hexdigest()[:32]
        return f"{REDIS_PREFIX}cc:{{{digest}}}"

    def kept(self, who: str) -> int:
        """How many leases this replica keeps for `who` with no statement holding them."""
        return len(self._kept.get(who, ()))

    async def take(self, who: str) -> str | None:
        """The lease's id, or None when the total could not be counted; refused past the total."""
        now = time.monotonic()
        kept = self._kept.get(who)
        while kept:
            lease, until, _ = kept.pop()
            if not kept:
                del self._kept[who]
            if until > now:  # no await since the check: nothing else can lend it meanwhile
                self._lendable[lease] = until
                return lease
            self._due.setdefault(who, []).append(lease)  # too old to lend: the sweep gives it back
        key, lease = self.key(who), os.urandom(8).hex()
        try:
            async with asyncio.timeout(SHARED_TIMEOUT_S):
                taken = int(await self._script(keys=[key], args=[self.total, self._life_ms, lease]))
        except (RedisError, OSError, TimeoutError) as err:
            if self._uncounted is not None:
                self._uncounted.inc()
            log.warning("consumer_share_uncounted", error=type(err).__name__)
            return None
        if not taken:
            raise _refused(self.total, " across the replicas")
        self._lendable[lease] = now + self._reuse_s
        return lease

    async def give_back(self, who: str, lease: str) -> None:
        """Kept for the consumer's next statement while it may be lent; given back after. A lease
        not given back (Redis gone meanwhile) expires by itself."""
        until = self._lendable.pop(lease, 0.0)
        now = time.monotonic()
        if self._keep_s > 0 and until > now + self._keep_s:
            self._kept.setdefault(who, []).append((lease, until, now + self._keep_s))
            self._sweeping()
            return
        await self._give_back({who: [lease]})

    async def _give_back(self, leases: dict[str, list[str]]) -> None:
        try:
            async with asyncio.timeout(SHARED_TIMEOUT_S):
                async with self._redis.pipeline(transaction=False) as pipe:
                    for who, ids in leases.items():
                        pipe.zrem(self.key(who), *ids)
                    await pipe.execute()
        except (RedisError, OSError, TimeoutError) as err:
            log.warning("consumer_share_lease_kept", error=type(err).__name__)

    def _sweeping(self) -> None:
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    async def _sweep(self) -> None:
        """Gives back the leases kept past KEEP_S (or no longer lendable); runs only while some
        are kept, so an idle replica has no task and sends nothing."""
        while self._kept or self._due:
            await asyncio.sleep(self._keep_s)
            due = self._expired(time.monotonic())
            if due:
                await self._give_back(due)

    def _expired(self, now: float) -> dict[str, list[str]]:
        due, self._due = self._due, {}
        for who, kept in list(self._kept.items()):
            stay = [k for k in kept if k[2] > now]
            if len(stay) < len(kept):
                due.setdefault(who, []).extend(k[0] for k in kept if k[2] <= now)
            if stay:
                self._kept[who] = stay
            else:
                del self._kept[who]
        return due

    async def close(self) -> None:
        """Every kept lease given back (the replica stops): another replica need not wait."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        due = self._expired(math.inf)  # every kept lease is due now
        if due:
            await self._give_back(due)


class ConsumerSlots:
    """Counts the statements each consumer has running; `limit` 0 turns the replica's share off,
    `shared` None the total across replicas."""

    def __init__(self, limit: int, shared: SharedShare | None = None) -> None:
        self.limit = limit
        self.shared = shared
        self._running: dict[str, int] = {}

    def running(self, who: str) -> int:
        return self._running.get(who, 0)

    @contextlib.asynccontextmanager
    async def hold(self, who: str) -> AsyncIterator[None]:
        """One slot of `who`'s share for the block, or the refusal before anything runs. No await
        between the replica's check and its count: the event loop cannot let a second request
        in between; the total is taken after, and the replica's slot is given back if refused."""
        if self.limit:
            held = self._running.get(who, 0)
            if held >= self.limit:
                raise _refused(self.limit, "")
            self._running[who] = held + 1
        try:
            lease = await self.shared.take(who) if self.shared is not None else None
            try:
                yield
            finally:
                if lease is not None:
                    assert self.shared is not None
                    await self.shared.give_back(who, lease)
        finally:
            if self.limit:
                left = self._running[who] - 1
                if left:
                    self._running[who] = left
                else:
                    del self._running[who]  # an idle consumer costs nothing
