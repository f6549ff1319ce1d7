"""Bounded stops: what a service's lifespan opened is closed in reverse, each part within a bound.

A lifespan opens its clients on one `contextlib.AsyncExitStack` and registers each one's stop
with `stop_on_exit`, so the lifespan reads as the list of what it opens and the stack closes them
last-opened first. A stop that fails or overruns its bound is logged by the part's name and the
next one runs: a broker or database that is gone must not keep the others open, nor hold the pod
past its termination grace (30 s in the chart, of which the preStop drain takes 5). What was not
finished is safe to lose: unsent events were never acknowledged, uncommitted offsets are read
again, a lease expires (docs/operations.md, "Start and stop")."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from dataplane_service_kit.logs import get_logger

log = get_logger(__name__)

# one part's stop; a Kafka producer gets longer (KAFKA_STOP_BOUND_S, dataplane_service_kit.kafka)
STOP_BOUND_S = 5.0


async def bounded_stop(
    part: str, stop: Callable[[], Awaitable[object]], timeout_s: float = STOP_BOUND_S
) -> None:
    """Run `stop()` for at most `timeout_s`. A failure or an overrun is logged
    (`shutdown_step_failed`, the part and the exception's class: never its text, which may
    quote an address or a statement) and swallowed; a cancellation of the caller passes."""
    try:
        async with asyncio.timeout(timeout_s):
            await stop()
    except asyncio.CancelledError:
        # aiokafka's fetcher leaks the CancelledError of its own task when the broker is gone;
        # only a cancellation aimed at the task running the shutdown is passed on
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
        log.warning("shutdown_step_failed", part=part, error="CancelledError")
    except Exception as exc:  # TimeoutError: the bound
        log.warning("shutdown_step_failed", part=part, error=type(exc).__name__)


def stop_on_exit(
    stack: contextlib.AsyncExitStack[bool | None],
    part: str,
    stop: Callable[[], Awaitable[object]],
    timeout_s: float = STOP_BOUND_S,
) -> None:
    """Register `stop` on the lifespan's stack, bounded (`bounded_stop`)."""
    stack.push_async_callback(bounded_stop, part, stop, timeout_s)
