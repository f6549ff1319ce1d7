"""Waiting for a condition an external system brings about (no fixed sleeps): the limit is
scaled by DATAPLANE_TEST_TIMEOUT_FACTOR and only bounds a hang."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any

from dataplane_local.timeouts import scaled


async def holds(check: Callable[[], Any]) -> bool:
    """`check()`, awaited when it returns an awaitable, as a bool."""
    result = check()
    if inspect.isawaitable(result):
        result = await result
    return bool(result)


async def eventually(check: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02) -> bool:
    """Poll `check` (sync or async) until it holds; whether it did within the (scaled) timeout,
    the last try made at the deadline."""
    deadline = time.monotonic() + scaled(timeout)
    while time.monotonic() < deadline:
        if await holds(check):
            return True
        await asyncio.sleep(interval)
    return await holds(check)


async def wait_for(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> None:
    """Poll `check` until it holds; an AssertionError naming `what` when the (scaled) timeout
    passes first."""
    if not await eventually(check, timeout, interval):
        raise AssertionError(f"timed out waiting for {what}")
