"""Issue 31 (one door), signaling's answers: whatever answers a request — a signal route, the
framework's 404 and 405, the body bound, a body the framework refuses, a probe, a fault nobody
caught — the answer carries the caller's `X-Request-ID` or one of its own, fresh per request; the
server span and every access record carry the same id; every answer is counted under its route
template with the full path (`/dps/...`), never the raw path. A real `signaling` process, its
spans exported over OTLP to the receiver double, its access records read from its log."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from dataplane_local.doubles.otlp_receiver import OtlpReceiver
from dataplane_local.doubles.otlp_receiver import create_app as otlp_app
from dataplane_local.doubles.server import RunningServer, serve_in_thread
from dataplane_testing.request_ids import Case, assert_counted, exchanged, fault_answered
from dataplane_testing.signaling import FLOWS, auth
from signaling.app import create_app
from signaling.settings import Settings

MAX_BODY = 2048
START = f"{FLOWS}/start"


@pytest.fixture
def receiver() -> Iterator[tuple[OtlpReceiver, RunningServer]]:
    state = OtlpReceiver()
    server = serve_in_thread(otlp_app(state))
    yield state, server
    server.stop()


def _cases(token: str) -> list[Case]:
    signed = {"headers": auth(token)}
    json_body = {"headers": {**auth(token), "content-type": "application/json"}}
    return [
        Case("not_found", "GET", "/issue31/nowhere", 404, "unmatched"),
        Case("method", "GET", START, 405, START),
        Case("too_large", "POST", START, 413, START, {**json_body, "content": b"{" + b" " * MAX_BODY + b"}"}),
        Case("unprocessable", "POST", START, 422, START, {**signed, "json": {}}),
        Case("not_json", "POST", START, 422, START, {**json_body, "content": b"{not json"}),
        Case("no_token", "POST", START, 401, START, {"json": {}}),
        Case("healthz", "GET", "/healthz", 200, "/healthz"),
        Case("metrics", "GET", "/metrics", 200, "/metrics"),
        Case("openapi", "GET", "/openapi.json", 200, "/openapi.json"),
        Case("signal", "GET", "/dps/registration", 200, "/dps/registration", signed),
    ]


async def test_issue31_every_signaling_answer_carries_its_own_request_id(
    spawn_signaling: Callable[..., Awaitable[Any]],
    base_settings: dict[str, Any],
    cp_token: Callable[..., str],
    receiver: tuple[OtlpReceiver, RunningServer],
) -> None:
    process = await spawn_signaling(
        {
            **base_settings,
            "signaling_max_body_bytes": MAX_BODY,
            "otel_exporter_otlp_endpoint": receiver[1].url,
            "otel_bsp_schedule_delay": 50,
        }
    )
    # GS-02: each refused signal writes its record
    recorded = {"unprocessable", "not_json", "no_token"}
    scraped = await exchanged(
        process.url, _cases(cp_token()), receiver[0], "signaling", process.log, recorded
    )
    counted = {
        ("unmatched", "404", "not_found"): 4,
        (START, "405", "method_not_allowed"): 4,
        (START, "413", "body_too_large"): 4,
        (START, "422", "invalid_message"): 8,
        (START, "401", "no_token"): 4,
        ("/dps/registration", "200", ""): 4,
    }
    assert_counted(scraped, "signaling", counted)
    assert "issue31/nowhere" not in scraped


async def test_issue31_a_signaling_fault_nobody_caught_is_500_with_its_request_id(
    base_settings: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """Signaling served without its lifespan (no database, no verifier): a signal fails with a
    fault of ours; the door answers `500 internal_error` with the request's id."""
    app = create_app(Settings(**base_settings))
    await fault_answered(app, Case("fault", "GET", "/dps/registration", 500, "/dps/registration"), caplog)
