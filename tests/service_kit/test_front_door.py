"""The front door (issue 31, "One door"; docs/operations.md, "The front door"): one layer in front
of every route records each answer by route template, status and code, times it, bounds the body
and gives every request an id of its own — the caller's when sane, else a fresh one per request,
never one carried over from the lifespan. A path with an id is counted under its template, a path
no route matched under `unmatched`, probes and the scrape not at all; an app that fails is a coded
500."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client import CollectorRegistry, Counter, Histogram

from dataplane_local.doubles.server import serve_in_thread
from dataplane_service_kit import front_door
from dataplane_service_kit.errors import ServiceError, install_error_handlers
from dataplane_service_kit.http_metrics import (
    BUCKETS,
    DURATION_HELP,
    DURATION_LABELS,
    REQUESTS_HELP,
    REQUESTS_LABELS,
)
from dataplane_service_kit.telemetry import ServerSpans

OFF = ServerSpans({"OTEL_SDK_DISABLED": "true"})


def _app() -> tuple[FastAPI, CollectorRegistry]:
    registry = CollectorRegistry()
    durations = Histogram(
        "probe_request_duration_seconds", DURATION_HELP, DURATION_LABELS, buckets=BUCKETS, registry=registry
    )
    requests = Counter("probe_requests_total", REQUESTS_HELP, REQUESTS_LABELS, registry=registry)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[dict[str, str]]:
        yield {"opened": "in the lifespan"}  # a lifespan state, copied into each request's scope

    app = FastAPI(lifespan=lifespan)
    install_error_handlers(app, "invalid_request")

    @app.get("/flows/{flow_id}")
    async def flow(flow_id: str) -> dict[str, str]:
        return {"id": flow_id}

    @app.post("/flows/{flow_id}/start")
    async def start(flow_id: str) -> None:
        raise ServiceError("flow_not_found", "no such flow")

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {}

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("defect")

    front_door.install(app, OFF, max_body_bytes=16, durations=durations, requests=requests)
    return app, registry


def _count(registry: CollectorRegistry, route: str, status: str, code: str = "") -> tuple[float, float]:
    timed = registry.get_sample_value(
        "probe_request_duration_seconds_count", {"route": route, "status": status}
    )
    counted = registry.get_sample_value(
        "probe_requests_total", {"route": route, "status": status, "code": code}
    )
    return timed or 0.0, counted or 0.0


async def test_issue31_every_answer_is_timed_and_counted_by_route_template_status_and_code() -> None:
    app, registry = _app()
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        assert (await client.get("/flows/person-42")).status_code == 200
        assert (await client.get("/flows/other")).status_code == 200
        assert (await client.get("/nowhere/person-42")).status_code == 404
        assert (await client.delete("/flows/person-42")).status_code == 405
        assert (await client.post("/flows/person-42/start")).status_code == 404
        assert (await client.post("/flows/person-42/start", content=b"x" * 17)).status_code == 413
        assert (await client.get("/healthz")).status_code == 200
        boom = await client.get("/boom")
    assert (boom.status_code, boom.json()["error"]) == (500, "internal_error")
    assert _count(registry, "/flows/{flow_id}", "200") == (2, 2)  # the template, never the id
    assert _count(registry, "unmatched", "404", "not_found") == (1, 1)
    assert _count(registry, "/flows/{flow_id}", "405", "method_not_allowed") == (1, 1)
    assert _count(registry, "/flows/{flow_id}/start", "404", "flow_not_found") == (1, 1)
    # refused before any route ran, still under the route's template
    assert _count(registry, "/flows/{flow_id}/start", "413", "body_too_large") == (1, 1)
    assert _count(registry, "/boom", "500", "internal_error") == (1, 1)
    assert _count(registry, "/healthz", "200") == (0, 0)  # probes are not requests of the service
    text = "\n".join(f"{s.name}{s.labels}" for metric in registry.collect() for s in metric.samples)
    assert "person-42" not in text and "nowhere" not in text


@pytest.fixture
def served() -> Iterator[str]:
    """The app under uvicorn, its lifespan run: the server copies the lifespan's state into
    every request's scope, where the door keeps the request's id."""
    app, _ = _app()
    server = serve_in_thread(app)
    yield server.url
    server.stop()


async def test_issue31_a_request_id_per_request_under_a_real_server(served: str) -> None:
    paths = ["/flows/a", "/nowhere", "/healthz", "/boom"]
    async with httpx.AsyncClient(base_url=served) as client:
        fresh = [(await client.get(p)).headers["x-request-id"] for p in paths + paths]
        echoed = [
            (await client.get(p, headers={"X-Request-ID": f"mine-{p}"})).headers["x-request-id"]
            for p in paths
        ]
        bad = await client.get("/flows/a", headers={"X-Request-ID": "x" * 129})
    assert len(set(fresh)) == len(fresh) and all(len(rid) == 32 for rid in fresh)
    assert echoed == [f"mine-{p}" for p in paths]
    assert len(bad.headers["x-request-id"]) == 32 and bad.headers["x-request-id"] not in fresh


def test_the_gateway_and_signaling_declare_their_http_families() -> None:
    from query_gateway.metrics import Metrics as GatewayMetrics
    from signaling.metrics import Metrics as SignalingMetrics

    # each app's registry, as its /metrics serves it
    registries = (GatewayMetrics().registry, SignalingMetrics().registry)
    kinds = {metric.name: metric.type for registry in registries for metric in registry.collect()}
    for service in ("query_gateway", "signaling"):
        assert kinds.get(f"{service}_request_duration_seconds") == "histogram"
        assert kinds.get(f"{service}_requests") == "counter"
