"""Issue 35, "readiness within its bound" (service kit): one /readyz answer takes at most
READYZ_BOUND_S whatever a check does — hangs, ignores its cancellation, or blocks in its cleanup —
and such a check is answered "down" and left running, one in flight per dependency, its answer
kept for the ttl. Times are measured against the bound constant alone (plus a slack)."""

from __future__ import annotations

import asyncio
import time

import httpx
from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from dataplane_service_kit.health import READYZ_BOUND_S, ReadinessCheck, health_router

SLACK_S = 0.25


class Stubborn:
    """A check that never answers, then, once cancelled, keeps blocking in its "cleanup" (as a
    driver's close that talks to a hung server does) until released."""

    def __init__(self) -> None:
        self.started = 0
        self.released = asyncio.Event()

    async def __call__(self) -> bool:
        self.started += 1
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await self.released.wait()  # the cleanup the cancellation waits for
            raise
        return True


def _client(checks: dict[str, ReadinessCheck], capabilities: dict[str, ReadinessCheck]) -> httpx.AsyncClient:
    app = FastAPI()
    app.include_router(
        health_router(lambda: checks, registry=CollectorRegistry(), capabilities=lambda: capabilities)
    )
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://svc")


async def _timed(client: httpx.AsyncClient) -> tuple[float, int, object]:
    started = time.monotonic()
    r = await client.get("/readyz")
    return time.monotonic() - started, r.status_code, r.json()


async def _ok() -> bool:
    return True


async def test_issue35_a_check_blocking_in_its_cleanup_is_down_within_the_bound() -> None:
    stubborn = Stubborn()
    async with _client({"db": stubborn}, {}) as client:
        try:
            elapsed, status, body = await _timed(client)
            assert elapsed <= READYZ_BOUND_S + SLACK_S, elapsed
            assert (status, body) == (503, {"status": "unready", "error": "not_ready", "failing": ["db"]})
        finally:
            stubborn.released.set()


async def test_issue35_a_stuck_capability_is_degraded_within_the_bound_and_probed_once() -> None:
    stubborn = Stubborn()
    async with _client({"db": _ok}, {"redis": stubborn}) as client:
        try:
            # concurrent callers (kubelet, a balancer, a person) and one after another past the ttl
            answers = await asyncio.gather(*(_timed(client) for _ in range(5)))
            answers.append(await _timed(client))
            for elapsed, status, body in answers:
                assert elapsed <= READYZ_BOUND_S + SLACK_S, elapsed
                assert (status, body) == (200, {"status": "ready", "degraded": ["redis"]})
            # the stuck probe is still in flight (never awaited, never doubled): one start only
            assert stubborn.started == 1
        finally:
            stubborn.released.set()


async def test_issue35_answers_are_kept_briefly() -> None:
    asked = 0

    async def counted() -> bool:
        nonlocal asked
        asked += 1
        return True

    async with _client({"db": counted}, {}) as client:
        for _ in range(3):
            _, status, _ = await _timed(client)
            assert status == 200
    assert asked == 1
