"""Issue 18: readiness split from capability (service kit). A lost capability keeps /readyz 200
and is named under `degraded` and in the gauge; a lost required dependency is 503 `failing`.
The probe cache shares one probe among concurrent callers and keeps its answer for its ttl."""

from __future__ import annotations

import asyncio

import httpx
from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from dataplane_service_kit.health import health_router
from dataplane_service_kit.readiness import CachedProbe


def _client(up: dict[str, bool], registry: CollectorRegistry) -> httpx.AsyncClient:
    def check(name: str):  # type: ignore[no-untyped-def]
        async def probe() -> bool:
            return up[name]

        return probe

    app = FastAPI()
    app.include_router(
        health_router(
            lambda: {"db": check("db")},
            registry=registry,
            capabilities=lambda: {"redis": check("redis")},
            ttl_s=0,  # each request asks again: the flips below are seen at once
        )
    )
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://svc")


async def test_issue18_a_lost_capability_keeps_the_replica_ready_and_is_reported() -> None:
    up = {"db": True, "redis": True}
    registry = CollectorRegistry()
    async with _client(up, registry) as client:
        r = await client.get("/readyz")
        assert (r.status_code, r.json()) == (200, {"status": "ready"})
        up["redis"] = False
        r = await client.get("/readyz")
        assert (r.status_code, r.json()) == (200, {"status": "ready", "degraded": ["redis"]})
        assert (
            registry.get_sample_value("readiness_dependency_up", {"dependency": "redis", "required": "false"})
            == 0
        )
        up["db"] = False
        r = await client.get("/readyz")
        assert r.status_code == 503
        assert r.json() == {
            "status": "unready",
            "error": "not_ready",
            "failing": ["db"],
            "degraded": ["redis"],
        }
        assert (
            registry.get_sample_value("readiness_dependency_up", {"dependency": "db", "required": "true"})
            == 0
        )


async def test_issue18_the_probe_is_shared_and_kept_for_its_ttl() -> None:
    asked = 0
    gate = asyncio.Event()

    async def ask() -> None:
        nonlocal asked
        asked += 1
        await gate.wait()

    probe = CachedProbe(ask, timeout_s=30, ttl_s=60)
    waiting = [asyncio.create_task(probe()) for _ in range(5)]
    await asyncio.sleep(0)
    gate.set()
    assert await asyncio.gather(*waiting) == [True] * 5
    assert await probe() is True
    assert asked == 1  # one probe for five concurrent callers, and its answer kept


async def test_issue18_a_probe_that_does_not_answer_in_time_is_down() -> None:
    async def never() -> None:
        await asyncio.Event().wait()

    probe = CachedProbe(never, timeout_s=0.05, ttl_s=0)
    assert await probe() is False
    await probe.aclose()
