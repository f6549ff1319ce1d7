"""/healthz, /readyz and /metrics, the same on every service.

Readiness runs each named check; the 503 body names the dependencies that failed, never their
URLs (which may carry credentials).

Two kinds of dependency: a *required* one (`checks`) without which the replica can serve nothing
useful, so /readyz fails and the replica leaves the Service; and a *capability* (`capabilities`)
whose loss only refuses some requests (each with its own code): the replica stays ready, and
/readyz names the lost capability under `degraded`. Both kinds are exported as the gauge
`readiness_dependency_up{dependency, required}`, so a degraded replica is seen, not only felt.

One answer of /readyz takes at most `READYZ_BOUND_S`, whatever a dependency does: the checks run
concurrently, each as a `CachedProbe` (one in flight per dependency, its answer kept briefly), and
a check still running at the bound is answered "down" and left running, never awaited — awaiting
a cancelled check waits for its cleanup, and a driver's cleanup (asyncpg's cancel request and
reset, a pool's rollback) talks to the very dependency that stopped answering."""

from __future__ import annotations

import asyncio
import contextlib
import functools
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
from dataplane_service_kit.readiness import DEFAULT_PROBE_TTL_S, CachedProbe

# the longest one /readyz answer takes; below the chart's readiness probe timeoutSeconds (2), so
# a kubelet never counts a slow answer as a failure (docs/faults.md, `/readyz`)
READYZ_BOUND_S = 1.5

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


class _Probes:
    """One `CachedProbe` per dependency name, asking the check the last request named: the
    services build their checks per request (closures over lifespan-created clients), so the
    name, not the function, is the dependency."""

    def __init__(self, bound_s: float, ttl_s: float) -> None:
        self._bound = bound_s
        self._ttl = ttl_s
        self._checks: dict[str, ReadinessCheck] = {}
        self._probes: dict[str, CachedProbe] = {}

    def pending(self, name: str, check: ReadinessCheck) -> asyncio.Future[bool]:
        self._checks[name] = check
        probe = self._probes.get(name)
        if probe is None:
            probe = self._probes[name] = CachedProbe(
                functools.partial(self._ask, name), timeout_s=self._bound, ttl_s=self._ttl, name=name
            )
        return probe.pending()

    def _ask(self, name: str) -> Awaitable[bool]:
        return self._checks[name]()  # the check the latest request named, not the first one

    async def answers(self, named: Mapping[str, ReadinessCheck]) -> dict[str, bool]:
        """Each name's answer within the bound; one not in by then is down (and keeps running)."""
        pending = {name: self.pending(name, check) for name, check in named.items()}
        if pending:
            await asyncio.wait(pending.values(), timeout=self._bound)
        return {name: _up(answer) for name, answer in pending.items()}


def _up(answer: asyncio.Future[bool]) -> bool:
    if not answer.done() or answer.cancelled():
        return False  # still running at the bound (or ended by a shutdown): no answer is "down"
    with contextlib.suppress(Exception):
        return answer.result()
    return False


def _no_capabilities() -> Mapping[str, ReadinessCheck]:
    return {}


def health_router(
    checks: Checks,
    registry: CollectorRegistry = REGISTRY,
    timeout: float = READYZ_BOUND_S,
    capabilities: Checks = _no_capabilities,
    ttl_s: float = DEFAULT_PROBE_TTL_S,
) -> APIRouter:
    """Build the router; `checks` and `capabilities` are called per request so lifespan-created
    clients are seen. A name in both counts as required. `timeout` bounds one /readyz answer;
    each dependency's answer is kept `ttl_s`."""
    router = APIRouter()
    gauge = dependency_gauge(registry)
    probes = _Probes(timeout, ttl_s)

    # documented in the OpenAPI of the services that serve one (the resolver and relay serve none)
    @router.get("/healthz", tags=["health"], summary="Alive", responses=HEALTHZ_RESPONSES)
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @router.get("/readyz", tags=["health"], summary="Dependencies reachable", responses=READYZ_RESPONSES)
    async def readyz() -> JSONResponse:
        required = dict(checks())
        optional = {k: v for k, v in capabilities().items() if k not in required}
        named = {**required, **optional}
        results = await probes.answers(named)
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
