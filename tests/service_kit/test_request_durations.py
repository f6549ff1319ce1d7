"""Request durations by route template and status (issue 14): the histogram a dashboard reads
latency and rate from. A path with an id is counted under its template, a path no route matched
under `unmatched`, probes and the scrape not at all; an app that fails counts as 500."""

from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client import CollectorRegistry, Histogram

from dataplane_service_kit.request_durations import BUCKETS, DURATION_HELP, DURATION_LABELS, RequestDurations


def _app() -> tuple[FastAPI, CollectorRegistry]:
    registry = CollectorRegistry()
    histogram = Histogram(
        "probe_request_duration_seconds", DURATION_HELP, DURATION_LABELS, buckets=BUCKETS, registry=registry
    )
    app = FastAPI()

    @app.get("/flows/{flow_id}")
    async def flow(flow_id: str) -> dict[str, str]:
        return {"id": flow_id}

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {}

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("defect")

    app.add_middleware(RequestDurations, histogram=histogram)
    return app, registry


def _count(registry: CollectorRegistry, route: str, status: str) -> float:
    value = registry.get_sample_value(
        "probe_request_duration_seconds_count", {"route": route, "status": status}
    )
    return value or 0.0


async def test_requests_are_timed_by_route_template_and_status() -> None:
    app, registry = _app()
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        assert (await client.get("/flows/person-42")).status_code == 200
        assert (await client.get("/flows/other")).status_code == 200
        assert (await client.get("/nowhere/person-42")).status_code == 404
        assert (await client.get("/healthz")).status_code == 200
        assert (await client.get("/boom")).status_code == 500
    assert _count(registry, "/flows/{flow_id}", "200") == 2  # the template, never the id
    assert _count(registry, "unmatched", "404") == 1
    assert _count(registry, "/boom", "500") == 1
    assert _count(registry, "/healthz", "200") == 0  # probes are not requests of the service
    text = "\n".join(f"{s.name}{s.labels}" for metric in registry.collect() for s in metric.samples)
    assert "person-42" not in text


DECLARED = ("query_gateway_request_duration_seconds", "signaling_request_duration_seconds")


@pytest.mark.parametrize("name", DECLARED)
def test_the_gateway_and_signaling_declare_their_histogram(name: str) -> None:
    from query_gateway.metrics import Metrics as GatewayMetrics
    from signaling.metrics import Metrics as SignalingMetrics

    # each app's registry, as its /metrics serves it
    registries = (GatewayMetrics().registry, SignalingMetrics().registry)
    kinds = {metric.name: metric.type for registry in registries for metric in registry.collect()}
    assert kinds.get(name) == "histogram"
