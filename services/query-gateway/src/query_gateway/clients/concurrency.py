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
in memory as they are and in Redis only as an HMAC; never logged."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import math
import os
from collections.abc import AsyncIterator

import redis.asyncio as aioredis
from prometheus_client import Counter
from redis.exceptions import RedisError

from dataplane_contracts.plans import REDIS_PREFIX
from dataplane_service_kit.errors import ServiceError
from dataplane_service_kit.logs import get_logger

log = get_logger(__name__)

RETRY_AFTER_S = "1"
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
    """A consumer's statements running on every replica, as leases in Redis."""

    def __init__(
        self,
        redis: aioredis.Redis,
        secret: bytes,
        total: int,
        lease_s: float,
        uncounted: Counter | None = None,
    ) -> None:
        self._redis = redis
        self._script = redis.register_script(TAKE_SCRIPT)  # EVALSHA, loaded again on NOSCRIPT
        self._secret = secret
        self.total = total
        self._lease_ms = max(1000, math.ceil(lease_s * 1000))
        self._uncounted = uncounted

    def key(self, who: str) -> str:
        digest = hmac.new(self._secret, who.encode(), hashlib.sha256).hexdigest()[:32]
        return f"{REDIS_PREFIX}cc:{{{digest}}}"

    async def take(self, who: str) -> str | None:
        """The lease's id, or None when the total could not be counted; refused past the total."""
        key, lease = self.key(who), os.urandom(8).hex()
        try:
            async with asyncio.timeout(SHARED_TIMEOUT_S):
                taken = int(await self._script(keys=[key], args=[self.total, self._lease_ms, lease]))
        except (RedisError, OSError, TimeoutError) as err:
            if self._uncounted is not None:
                self._uncounted.inc()
            log.warning("consumer_share_uncounted", error=type(err).__name__)
            return None
        if not taken:
            raise _refused(self.total, " across the replicas")
        return lease

    async def give_back(self, who: str, lease: str) -> None:
        """A lease not given back (Redis gone meanwhile) expires by itself."""
        try:
            async with asyncio.timeout(SHARED_TIMEOUT_S):
                await self._redis.zrem(self.key(who), lease)
        except (RedisError, OSError, TimeoutError) as err:
            log.warning("consumer_share_lease_kept", error=type(err).__name__)


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
