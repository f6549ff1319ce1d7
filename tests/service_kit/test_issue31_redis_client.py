"""Issue 31: the one Redis client of the gateway and the resolver (dataplane_service_kit.
redis_clients), against a real Redis and a server that accepts connections but never answers."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from dataplane_contracts.settings import RedisSettings
from dataplane_service_kit.redis_clients import opened_redis, redis_client


async def test_issue31_the_client_talks_to_redis_and_the_stack_closes_it(redis_url: str, unique: str) -> None:
    name = f"issue31-{unique}"
    async with contextlib.AsyncExitStack() as stack:
        client = opened_redis(RedisSettings(redis_url=redis_url), stack)
        await client.client_setname(name)
        await client.set("issue31", b"v", ex=30)
        assert await client.get("issue31") == b"v"
        observer = redis_client(RedisSettings(redis_url=redis_url))
        assert name in {c["name"] for c in await observer.client_list()}
    # closed with the stack: Redis no longer lists its connection
    assert name not in {c["name"] for c in await observer.client_list()}
    await observer.aclose()


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A port whose listener completes the TCP handshake (the kernel's backlog) and never answers."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    yield sock.getsockname()[1]
    sock.close()


async def test_issue31_a_command_redis_never_answers_ends_at_the_socket_timeout_once(
    silent_server: int,
) -> None:
    settings = RedisSettings(
        redis_url=f"redis://127.0.0.1:{silent_server}/0",
        redis_connect_timeout_seconds=0.5,
        redis_socket_timeout_seconds=1.0,
    )
    client = redis_client(settings)
    started = time.monotonic()
    with pytest.raises(RedisTimeoutError):
        await client.ping()
    # one bound, not two: a timeout is not retried (the retry is for a dropped connection)
    assert 0.9 <= time.monotonic() - started < 1.9
    await client.aclose()


async def test_issue31_a_stopped_redis_is_refused_not_waited_for() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens here once closed
    client = redis_client(RedisSettings(redis_url=f"redis://127.0.0.1:{port}/0"))
    started = time.monotonic()
    with pytest.raises(RedisConnectionError):
        await client.ping()
    assert time.monotonic() - started < 2.0  # within the connect bound, retried once at most
    await client.aclose()
