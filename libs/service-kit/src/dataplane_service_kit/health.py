"""/healthz, /readyz and /metrics, the same on every service.

Readiness runs each named check; the 503 body names the dependencies that failed, never their
URLs (which may carry credentials).

Two kinds of dependency: a *required* one (`checks`) without which the replica can serve nothing
useful, so /readyz fails and the replica leaves the Service; and a *capability* (`capabilities`)
whose loss only refuses some requests (each with its own code): the replica stays ready, and
/readyz names the lost capability under `degraded`. Both kinds are exported as the gauge
`readiness_dependency_up{dependency, required}`, so a degraded replica is seen, not only felt."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable, Mapping

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Gauge,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)

from dataplane_service_kit.openapi import HEALTHZ_RESPONSES, METRICS_RESPONSES, READYZ_RESPONSES

# no `<name>_created` twin beside each counter and histogram: a series per metric (and label set)
# that no dashboard or alert reads, in every service that serves /metrics through this module
disable_created_metrics()  # type: ignore[no-untyped-call]


def app_registry() -> CollectorRegistry:
    """A registry for one app's metrics, with what prometheus_client's global registry serves
    beside them (process_*, python_info, python_gc_*, in its order): an app's /metrics reads as
    it did on the global registry, and two apps in one process never count into each other."""
    registry = CollectorRegistry()
    GCCollector(registry=registry)
    PlatformCollector(registry=registry)
    ProcessCollector(registry=registry)
    return registry


ReadinessCheck = Callable[[], Awaitable[bool]]
Checks = Callable[[], Mapping[str, ReadinessCheck]]

# one gauge per registry: several apps (tests, or one process serving two) may share a registry.
# Weakly keyed by the registry itself, not by id(): a registry per app is dropped with its app, and
# a later one given the same id must get a gauge of its own, not the dead one's
_GAUGES: weakref.WeakKeyDictionary[CollectorRegistry, Gauge] = weakref.WeakKeyDictionary()


def dependency_gauge(registry: CollectorRegistry = REGISTRY) -> Gauge:
    gauge = _GAUGES.get(registry)
    if gauge is None:
        gauge = Gauge(
            "readiness_dependency_up",
            "1 when the dependency answered the last readiness probe; required=false: a capability",
            ["dependency", "required"],
            registry=registry,
        )
        _GAUGES[registry] = gauge
    return gauge


async def _run(check: ReadinessCheck, timeout: float) -> bool:
    try:
        return await asyncio.wait_for(check(), timeout)
    except Exception:  # a failing check is an answer ("not ready"), not an error of /readyz
        return False


def _no_capabilities() -> Mapping[str, ReadinessCheck]:
    return {}


def health_router(
    checks: Checks,
    registry: CollectorRegistry = REGISTRY,
    timeout: float = 2.0,
    capabilities: Checks = _no_capabilities,
) -> APIRouter:
    """Build the router; `checks` and `capabilities` are called per request so lifespan-created
    clients are seen. A name in both counts as required."""
    router = APIRouter()
    gauge = dependency_gauge(registry)

    # documented in the OpenAPI of the services that serve one (the resolver and relay serve none)
    @router.get("/healthz", tags=["health"], summary="Alive", responses=HEALTHZ_RESPONSES)
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @router.get("/readyz", tags=["health"], summary="Dependencies reachable", responses=READYZ_RESPONSES)
    async def readyz() -> JSONResponse:
        required = dict(checks())
        optional = {k: v for k, v in capabilities().items() if k not in required}
        named = {**required, **optional}
        results = dict(
            zip(named, await asyncio.gather(*(_run(c, timeout) for c in named.values())), strict=True)
        )
        for name, up in results.items():
            gauge.labels(dependency=name, required=str(name in required).lower()).set(1 if up else 0)
        failing = sorted(name for name in required if not results[name])
        degraded = sorted(name for name in optional if not results[name])
        body: dict[str, object]
        if failing:
            body = {"status": "unready", "error": "not_ready", "failing": failing}
            if degraded:
                body["degraded"] = degraded
            return JSONResponse(body, status_code=503)
        body = {"status": "ready"}
        if degraded:  # absent when whole: a ready replica's body is unchanged
            body["degraded"] = degraded
        return JSONResponse(body)

    @router.get(
        "/metrics",
        tags=["health"],
        summary="Prometheus metrics",
        response_class=Response,
        responses=METRICS_RESPONSES,
    )
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return router
