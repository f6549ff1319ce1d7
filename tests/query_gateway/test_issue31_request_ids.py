"""Issue 31 (one door): whatever answers a request — the fast path, a FastAPI route, the framework's
404 and 405, the body bound, a body the framework refuses, a probe, a fault nobody caught — the
gateway's answer carries the caller's `X-Request-ID` or one of its own, fresh per request; the
request's server span and every access record carry the same id, and every refusal is counted
under its route template. A real `query-gateway` process (uvicorn copies the lifespan's state into
each request: an id kept there would be one per process), its spans exported over OTLP to the
receiver double, its access records read from its log."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dataplane_local.doubles.otlp_receiver import OtlpReceiver
from dataplane_local.doubles.otlp_receiver import create_app as otlp_app
from dataplane_local.doubles.server import RunningServer, serve_in_thread
from dataplane_testing.gateway import PUBLIC_PEM, World, process_env
from dataplane_testing.processes import ServiceProcess
from dataplane_testing.request_ids import Case, assert_counted, exchanged, fault_answered
from query_gateway.app import create_app

JSON = {"content-type": "application/json"}
PUBLIC_SQL = "SELECT id FROM stats ORDER BY id"
RECORDS = "/dps/public/streams/{dataset}/records"


@pytest.fixture(scope="module")
def receiver() -> Iterator[tuple[OtlpReceiver, RunningServer]]:
    state = OtlpReceiver()
    server = serve_in_thread(otlp_app(state))
    yield state, server
    server.stop()


@pytest.fixture(scope="module")
async def gateway(
    world: World, flows_url: str, receiver: tuple[OtlpReceiver, RunningServer], tmp_path_factory: Any
) -> Any:
    settings = world.settings(
        dps_enabled=True, dps_token_public_key=PUBLIC_PEM, dps_flows_database_url=flows_url
    )
    script = shutil.which("query-gateway")
    assert script is not None
    env = {
        **process_env(settings, 0),
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver[1].url,
        "OTEL_BSP_SCHEDULE_DELAY": "50",
    }
    log = Path(tmp_path_factory.mktemp("issue31")) / "gateway.log"
    process = ServiceProcess([script], env, log, "query-gateway").start()
    try:
        await process.wait_ready()
        yield process
    finally:
        process.stop()


def _cases(limit: int) -> list[Case]:
    return [
        Case("not_found", "GET", "/issue31/nowhere", 404, "unmatched"),
        Case("method", "GET", "/query", 405, "/query"),
        Case(
            "too_large",
            "POST",
            "/query",
            413,
            "/query",
            {"content": b"{" + b" " * limit + b"}", "headers": JSON},
        ),
        Case(
            "unprocessable", "POST", "/query", 422, "/query", {"json": {"sql": PUBLIC_SQL, "limit": "many"}}
        ),
        Case("invalid_body", "POST", "/query", 400, "/query", {"content": b"{not json", "headers": JSON}),
        Case("healthz", "GET", "/healthz", 200, "/healthz"),
        Case("metrics", "GET", "/metrics", 200, "/metrics"),
        Case("openapi", "GET", "/openapi.json", 200, "/openapi.json"),
        Case("query", "POST", "/query", 200, "/query", {"json": {"sql": PUBLIC_SQL}}),
        Case("records", "GET", "/dps/public/streams/stats/records", 401, RECORDS),
    ]


async def test_issue31_every_gateway_answer_carries_its_own_request_id(
    gateway: ServiceProcess, world: World, receiver: tuple[OtlpReceiver, RunningServer]
) -> None:
    cases = _cases(world.settings().query_max_body_bytes)
    # the query, the records refusal and the body refused at the door each write access records
    scraped = await exchanged(
        gateway.url, cases, receiver[0], "query-gateway", gateway.log, {"query", "records", "too_large"}
    )
    # every refusal counted, under the template (or `unmatched`), never the raw path
    counted = {
        ("unmatched", "404", "not_found"): 4,
        ("/query", "405", "method_not_allowed"): 4,
        ("/query", "413", "body_too_large"): 4,
        ("/query", "422", "invalid_request"): 4,
        ("/query", "400", "invalid_body"): 4,
        ("/query", "200", ""): 4,
        (RECORDS, "401", "pull_token"): 4,
    }
    assert_counted(scraped, "query_gateway", counted)
    assert "issue31/nowhere" not in scraped and "/streams/stats" not in scraped


async def test_issue31_a_fault_nobody_caught_is_500_with_its_request_id(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    """A gateway served without its lifespan: every query fails in the fast path with a fault of
    ours, which the door answers `500 internal_error` with the id, counted under its route."""
    app = create_app(world.settings())
    await fault_answered(
        app, Case("fault", "POST", "/query", 500, "/query", {"json": {"sql": PUBLIC_SQL}}), caplog
    )
    labels = {"route": "/query", "status": "500", "code": "internal_error"}
    assert app.state.metrics.registry.get_sample_value("query_gateway_requests_total", labels) == 4
