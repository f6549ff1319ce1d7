"""The one Redis client configuration (the gateway's plan cache, claim checks, rate buckets and
consumer leases; the resolver's plan cache): explicit bounds rather than the library's defaults,
so a stopped Redis is a coded refusal within REDIS_CONNECT_TIMEOUT_SECONDS and
REDIS_SOCKET_TIMEOUT_SECONDS instead of a held request (docs/faults.md)."""

from __future__ import annotations

import contextlib

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from dataplane_contracts.settings import RedisSettings
from dataplane_service_kit.shutdown import stop_on_exit


def redis_client(settings: RedisSettings) -> aioredis.Redis:
    """A client of REDIS_URL; its connections open on first use."""
    return aioredis.from_url(
        settings.redis_url,
        socket_connect_timeout=settings.redis_connect_timeout_seconds,
        socket_timeout=settings.redis_socket_timeout_seconds,
        # a dropped connection is tried once more; a timeout is not (its bound is the bound)
        retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
    )


def opened_redis(settings: RedisSettings, stack: contextlib.AsyncExitStack[bool | None]) -> aioredis.Redis:
    """`redis_client`, closed (bounded) when the lifespan's stack closes."""
    client = redis_client(settings)
    stop_on_exit(stack, "redis", client.aclose)
    return client
