"""Bounded retries for transient upstream failures, before anything is concluded.

Sized for a blip (3 attempts from 20 ms), not an outage: a lookup still failing after that is
reported as `row_filter_unavailable`, never turned into a deny or a pass."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg
import httpx

from dataplane_service_kit.backoff import exponential_delay
from filter_resolver.errors import TransientUpstream

T = TypeVar("T")

_TRANSIENT: tuple[type[BaseException], ...] = (
    TransientUpstream,
    httpx.TransportError,  # connection refused/reset, timeouts, protocol errors
    TimeoutError,
    ConnectionError,
    OSError,
    asyncpg.PostgresConnectionError,
    asyncpg.CannotConnectNowError,
    asyncpg.TooManyConnectionsError,
    asyncpg.InterfaceError,
)


def is_transient(exc: BaseException) -> bool:
    # a URL with no usable scheme is a configuration error, asking again cannot fix it
    return isinstance(exc, _TRANSIENT) and not isinstance(exc, httpx.UnsupportedProtocol)


class RetriesExhausted(Exception):
    """Every attempt failed transiently; `last` is the final failure (never rendered)."""

    def __init__(self, attempts: int, last: BaseException) -> None:
        super().__init__(f"{attempts} attempts failed")
        self.attempts = attempts
        self.last = last


def backoff_delays(attempts: int, base_ms: int) -> tuple[float, ...]:
    """Seconds to wait after each failed attempt but the last: base, 2·base, 4·base …

    Its own function so the schedule the settings give (3 attempts from 20 ms → 0.02 s, 0.04 s)
    can be read and checked without timing a single call."""
    return tuple(exponential_delay(n, initial_s=base_ms / 1000) for n in range(attempts - 1))


async def with_retries(
    attempt: Callable[[], Awaitable[T]],
    attempts: int,
    base_ms: int,
    on_retry: Callable[[int, BaseException], None] | None = None,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
) -> T:
    """Run `attempt` up to `attempts` times, waiting `backoff_delays(attempts, base_ms)` between.

    A non-transient failure propagates at once: a definite answer is not improved by asking
    again. Raises RetriesExhausted when every try failed transiently. `sleep` is how the wait is
    taken (a caller that records it sees the exact schedule)."""
    delays = backoff_delays(attempts, base_ms)
    for number in range(1, attempts + 1):
        try:
            return await attempt()
        except Exception as exc:
            if not is_transient(exc):
                raise
            if number == attempts:
                raise RetriesExhausted(attempts, exc) from exc
            if on_retry is not None:
                on_retry(number, exc)
            await sleep(delays[number - 1])
    raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises
