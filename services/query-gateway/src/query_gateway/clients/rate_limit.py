"""GS-14: a token bucket per consumer and dataset, held in Redis so every gateway replica takes
from the same one (docs/gateway.md). One script call per request takes a token from the bucket
of every dataset the statement touches, all or none, on Redis's clock (the replicas' clocks may
disagree; the store's is one). A bucket that cannot be read refuses the request: the limiter
never turns itself off."""

from __future__ import annotations

import hashlib
import hmac
import math
from collections.abc import Sequence
from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from dataplane_contracts.catalogue import DatasetEntry
from dataplane_contracts.plans import REDIS_PREFIX
from dataplane_service_kit.errors import ServiceError
from dataplane_service_kit.logs import get_logger

log = get_logger(__name__)

# KEYS: one bucket per dataset. ARGV: per key its rate (tokens/s) and burst (most held).
# A bucket is a hash {t: tokens left, ts: when they were counted}; a missing one is full.
# Answers 0 when a token was taken from every bucket, else the milliseconds until the emptiest
# one holds a token again (nothing taken from any).
BUCKET_SCRIPT = """
local now = redis.call('TIME')
local t = tonumber(now[1]) + tonumber(now[2]) / 1000000
local have = {}
local wait = 0
for i = 1, #KEYS do
  local rate = tonumber(ARGV[2 * i - 1])
  local burst = tonumber(ARGV[2 * i])
  local held = redis.call('HMGET', KEYS[i], 't', 'ts')
  local tokens = burst
  if held[1] and held[2] then
    tokens = math.min(burst, tonumber(held[1]) + math.max(0, t - tonumber(held[2])) * rate)
  end
  have[i] = tokens
  if tokens < 1 then
    wait = math.max(wait, (1 - tokens) / rate)
  end
end
if wait > 0 then
  return math.max(1, math.ceil(wait * 1000))
end
for i = 1, #KEYS do
  local rate = tonumber(ARGV[2 * i - 1])
  local burst = tonumber(ARGV[2 * i])
  redis.call('HSET', KEYS[i], 't', tostring(have[i] - 1), 'ts', tostring(t))
  redis.call('PEXPIRE', KEYS[i], math.ceil(burst / rate * 1000) + 1000)
end
return 0
"""

ANONYMOUS = "anonymous"  # every caller without a bearer shares one bucket per dataset


@dataclass(frozen=True)
class Limit:
    per_second: float
    burst: int


def default_limit(per_second: float, burst: int) -> Limit | None:
    """RATE_LIMIT_PER_SECOND/RATE_LIMIT_BURST; None when the operator set no default (0)."""
    if per_second <= 0:
        return None
    return Limit(per_second, burst if burst > 0 else max(1, math.ceil(per_second)))


def limit_of(entry: DatasetEntry, default: Limit | None) -> Limit | None:
    spec = entry.rate_limit
    return Limit(spec.per_second, spec.burst) if spec is not None else default


def refill_wait(tokens: float, per_second: float) -> float:
    """Seconds until a bucket holding `tokens` holds one (the script's arithmetic, for tests)."""
    return max(0.0, (1 - tokens) / per_second)


def retry_after(wait_ms: int) -> str:
    """`Retry-After` in whole seconds, rounded up: a client that waits that long finds a token."""
    return str(max(1, math.ceil(wait_ms / 1000)))


class RateLimiter:
    """Admits a consumer's read of some datasets or refuses it (429 rate_limited, 503
    rate_limit_unavailable). The consumer id is personal data: the bucket's key carries only its
    HMAC under the plan cache's key secret, as the plan cache's keys do."""

    def __init__(self, redis: aioredis.Redis, secret: bytes, default: Limit | None) -> None:
        self._script = redis.register_script(BUCKET_SCRIPT)  # EVALSHA, loaded again on NOSCRIPT
        self._secret = secret
        self.default = default

    def bucket_key(self, kind: str, consumer: str | None, dataset_id: str) -> str:
        who = f"{kind}\x00{consumer if consumer is not None else ANONYMOUS}".encode()
        digest = hmac.new(self._secret, who, hashlib.sha256).hexdigest()[:32]
        # the braces keep one consumer's buckets in one cluster slot: one script may touch them
        return f"{REDIS_PREFIX}rl:{{{digest}}}:{dataset_id}"

    async def admit(self, kind: str, consumer: str | None, entries: Sequence[DatasetEntry]) -> None:
        """`kind` names the identity's namespace (`sub` on the normal path, `did` on the
        dataspace paths). No limited dataset among `entries`: no round trip at all."""
        keys: list[str] = []
        args: list[str] = []
        for entry in entries:
            limit = limit_of(entry, self.default)
            if limit is None:
                continue
            keys.append(self.bucket_key(kind, consumer, entry.id))
            args += [repr(limit.per_second), str(limit.burst)]
        if not keys:
            return
        try:
            wait_ms = int(await self._script(keys=keys, args=args))
        except (RedisError, OSError, TimeoutError) as err:
            log.warning("rate_limit_unavailable", error=type(err).__name__)
            raise ServiceError(
                "rate_limit_unavailable", "the rate limiter cannot be reached; retry later"
            ) from None
        if wait_ms > 0:
            seconds = retry_after(wait_ms)
            raise ServiceError(
                "rate_limited",
                f"rate limit reached for this consumer; retry after {seconds} s",
                headers={"Retry-After": seconds},
            )
