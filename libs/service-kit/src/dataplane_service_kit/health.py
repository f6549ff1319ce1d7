"""/healthz, /readyz and /metrics, the same on every service.

Readiness runs each named check; the 503 body names the dependencies that failed, never their
URLs (which may carry credentials)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

ReadinessCheck = Callable[[], Awaitable[bool]]


async def _run(check: ReadinessCheck, timeout: float) -> bool:
    try:
        return await asyncio.wait_for(check(), timeout)
    except Exception:  # a failing check is an answer ("not ready"), not an error of /readyz
        return False


def health_router(
    checks: Callable[[], Mapping[str, ReadinessCheck]],
    registry: CollectorRegistry = REGISTRY,
    timeout: float = 2.0,
) -> APIRouter:
    """Build the router; `checks` is called per request so lifespan-created clients are seen."""
    router = APIRouter()

    @router.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @router.get("/readyz", include_in_schema=False)
    async def readyz() -> JSONResponse:
        named = dict(checks())
        results = await asyncio.gather(*(_run(c, timeout) for c in named.values()))
        failing = sorted(name for name, ok in zip(named, results, strict=True) if not ok)
        if failing:
            return JSONResponse(
                {"status": "unready", "error": "not_ready", "failing": failing}, status_code=503
            )
        return JSONResponse({"status": "ready"})

    @router.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return router
