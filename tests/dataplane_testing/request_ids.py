"""Issue 31's exchange (one door): each answer a service gives, asked with and without an
`X-Request-ID`, and what must carry the id the answer carries — the server span exported over OTLP
(the receiver double) and every access record the service wrote on its log."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from dataplane_local.doubles.otlp_receiver import OtlpReceiver, SpanRecord
from dataplane_local.doubles.server import serve_in_thread
from dataplane_service_kit.telemetry import REQUEST_ID_ATTRIBUTE, SERVER_SCOPE

from .metrics import series
from .polling import wait_for

PROBES = ("/healthz", "/readyz", "/metrics")


@dataclass(frozen=True)
class Case:
    """One answer: the request that gets it, and its status."""

    name: str
    method: str
    path: str
    status: int
    route: str  # the route template the door counts it under
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class Asked:
    """A case's four answers: two without an id, one with the caller's own, one with an id no
    proxy or log line could carry intact (so replaced by a fresh one)."""

    case: Case
    fresh: list[httpx.Response]
    own: httpx.Response
    replaced: httpx.Response

    @property
    def ids(self) -> list[str]:
        return [r.headers["x-request-id"] for r in (*self.fresh, self.own, self.replaced)]


async def ask(client: httpx.AsyncClient, cases: list[Case]) -> list[Asked]:
    asked: list[Asked] = []
    for case in cases:
        fresh = [await _send(client, case, {}) for _ in range(2)]
        own = await _send(client, case, {"X-Request-ID": f"issue31-{case.name}"})
        replaced = await _send(client, case, {"X-Request-ID": "two words"})
        for answer in (*fresh, own, replaced):
            assert answer.status_code == case.status, (case.name, answer.status_code, answer.text)
        asked.append(Asked(case, fresh, own, replaced))
    return asked


async def _send(client: httpx.AsyncClient, case: Case, headers: dict[str, str]) -> httpx.Response:
    kwargs = dict(case.kwargs)
    kwargs["headers"] = {**kwargs.get("headers", {}), **headers}
    return await client.request(case.method, case.path, **kwargs)


def assert_ids(asked: list[Asked]) -> None:
    """The caller's id comes back; without one, a fresh one per request, never the same twice."""
    for a in asked:
        assert a.own.headers["x-request-id"] == f"issue31-{a.case.name}", a.case.name
    fresh = [r.headers["x-request-id"] for a in asked for r in (*a.fresh, a.replaced)]
    assert len(set(fresh)) == len(fresh), fresh
    assert all(len(rid) == 32 and int(rid, 16) >= 0 for rid in fresh), fresh


async def assert_spans(receiver: OtlpReceiver, service: str, asked: list[Asked]) -> None:
    """Every answer but the probes' has its server span carrying its id, named by its route."""
    expected = {rid: a.case for a in asked if a.case.path not in PROBES for rid in a.ids}

    def server_spans() -> dict[str, SpanRecord]:
        return {
            s.attributes.get(REQUEST_ID_ATTRIBUTE, ""): s
            for s in receiver.spans(service=service)
            if s.scope == SERVER_SCOPE
        }

    await wait_for(lambda: set(expected) <= set(server_spans()), 30, f"{service}'s server spans")
    spans = server_spans()
    for rid, case in expected.items():
        span = spans[rid]
        assert span.attributes.get("http.route") == case.route, (case.name, span)
        assert span.name == f"{case.method} {case.route}", (case.name, span.name)
    probes = {rid for a in asked if a.case.path in PROBES for rid in a.ids}
    assert probes.isdisjoint(spans)  # probes and the scrape make no span (docs/operations.md)


def access_records(log: str) -> Iterator[dict[str, Any]]:
    """The access records (logger `dataplane.audit`: GS-01, GS-02) among a service's JSON lines."""
    for line in log.splitlines():
        if not line.startswith("{"):
            continue
        record = json.loads(line)
        if "action" in record and "outcome" in record:
            yield record


def assert_records(log: str, asked: list[Asked], recorded: set[str]) -> None:
    """Every access record carries the id of an answer; each case in `recorded` wrote its own."""
    answered = {rid for a in asked for rid in a.ids}
    records = list(access_records(log))
    assert records, "no access record written"
    assert {r["request_id"] for r in records} <= answered
    for a in asked:
        if a.case.name in recorded:
            ids = {r["request_id"] for r in records}
            assert set(a.ids) <= ids, (a.case.name, a.ids)


async def exchanged(
    url: str,
    cases: list[Case],
    receiver: OtlpReceiver,
    service: str,
    log: Callable[[], str],
    recorded: set[str],
) -> str:
    """Ask each case of a running service and check every id (answers, spans, the access records
    of the cases in `recorded`); the service's /metrics text after."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        asked = await ask(client, cases)
        scraped = (await client.get("/metrics")).text
    assert_ids(asked)
    await assert_spans(receiver, service, asked)
    assert_records(log(), asked, recorded)
    return scraped


def assert_counted(scraped: str, service: str, counted: dict[tuple[str, str, str], float]) -> None:
    """Each (route, status, code) counted so many times, and timed under (route, status)."""
    for (route, status, code), n in counted.items():
        labels = {"route": route, "status": status, "code": code}
        assert series(scraped, f"{service}_requests_total", **labels) == n, labels
        timed = series(scraped, f"{service}_request_duration_seconds_count", route=route, status=status)
        assert timed >= n, labels


async def fault_answered(app: FastAPI, case: Case, caplog: pytest.LogCaptureFixture) -> Asked:
    """`case` asked of `app` served without its lifespan (nothing it opens is there, so a route
    that needs it fails with a fault of ours): 500 internal_error with the request's id, which the
    fault's one log line names."""
    server = serve_in_thread(app, lifespan=False)
    caplog.set_level(logging.ERROR, logger="dataplane_service_kit.errors")
    try:
        async with httpx.AsyncClient(base_url=server.url) as client:
            [asked] = await ask(client, [case])
    finally:
        server.stop()
    assert_ids([asked])
    assert {r.json()["error"] for r in (*asked.fresh, asked.own)} == {"internal_error"}
    assert [r.msg["request_id"] for r in caplog.records if isinstance(r.msg, dict)] == asked.ids
    return asked
