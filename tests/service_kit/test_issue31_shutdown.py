"""Issue 31: every part a lifespan opens stops within its bound, and one part's failure or hang
never keeps the others open (dataplane_service_kit.shutdown)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

import pytest

from dataplane_service_kit.logs import configure_logging
from dataplane_service_kit.shutdown import bounded_stop, stop_on_exit


@pytest.fixture
def service_logging() -> None:
    """The services' JSON logging, set up before the test's own log capture starts."""
    configure_logging("issue31", "INFO")


@pytest.fixture
def warnings(service_logging: None, caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.WARNING)
    return caplog


async def test_issue31_the_stack_closes_every_part_in_reverse_past_a_failing_and_a_hung_one(
    warnings: pytest.LogCaptureFixture,
) -> None:
    stopped: list[str] = []

    def part(name: str) -> Callable[[], Awaitable[None]]:
        async def stop() -> None:
            stopped.append(name)

        return stop

    async def failing() -> None:
        raise ConnectionResetError("10.0.0.7:9092 gone")

    async def hung() -> None:
        await asyncio.sleep(3600)

    started = time.monotonic()
    async with contextlib.AsyncExitStack() as stack:
        stop_on_exit(stack, "first", part("first"))
        stop_on_exit(stack, "broker", failing)
        stop_on_exit(stack, "database", hung, timeout_s=0.2)
        stop_on_exit(stack, "last", part("last"))
    assert time.monotonic() - started < 2
    assert stopped == ["last", "first"]
    text = " ".join(r.getMessage() for r in warnings.records)
    assert "shutdown_step_failed" in text
    assert "'part': 'database'" in text and "TimeoutError" in text
    assert "'part': 'broker'" in text and "ConnectionResetError" in text
    # the exception's class only: its text may name an address, a statement, a principal
    assert "10.0.0.7" not in text


async def test_issue31_a_cancelled_shutdown_is_not_swallowed() -> None:
    entered = asyncio.Event()

    async def slow() -> None:
        entered.set()
        await asyncio.sleep(3600)

    task = asyncio.create_task(bounded_stop("slow", slow, timeout_s=60))
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_issue31_a_cancellation_leaked_by_a_library_is_a_failed_part_not_the_callers(
    warnings: pytest.LogCaptureFixture,
) -> None:
    async def leaks() -> None:
        # what aiokafka's fetcher does when the broker is gone: its own task's CancelledError
        raise asyncio.CancelledError

    await bounded_stop("kafka_consumer", leaks)  # returns: nobody cancelled this task
    assert any("CancelledError" in r.getMessage() for r in warnings.records)
