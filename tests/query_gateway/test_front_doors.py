"""Issue 20 (hot path), issue 31 (one door): behind the one front door, the query routes have two
callers — `QueryRoutes`, the fast path, for a well-formed JSON body, and the FastAPI routes for
everything it passes on. A client cannot tell them apart: the same request answers the same
through either (QE-01's answer and its refusals), and what the fast path must not decide reaches
FastAPI with its body intact."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from starlette.types import Message, Receive, Scope, Send

from dataplane_service_kit.front_door import FrontDoor
from dataplane_service_kit.telemetry import ServerSpans
from query_gateway.routes import QueryRoutes

PUBLIC_SQL = "SELECT id FROM stats ORDER BY id"
# the fast path answers the first three; FastAPI decodes the last as JSON too (a +json subtype)
PLAIN = ("application/json", "application/json; charset=utf-8", None)
FRAMEWORK = "application/vnd.dataplane+json"


async def _post(client: httpx.AsyncClient, body: dict[str, Any], content_type: str | None) -> httpx.Response:
    headers = {"X-Request-ID": "req-door"}
    if content_type is not None:
        headers["content-type"] = content_type
    return await client.post("/query", content=json.dumps(body).encode(), headers=headers)


def _answer(r: httpx.Response) -> tuple[int, str, Any, str | None]:
    return r.status_code, r.headers["content-type"], r.json(), r.headers.get("x-request-id")


@pytest.mark.parametrize(
    "body",
    [
        {"sql": PUBLIC_SQL, "limit": 2},
        {"sql": PUBLIC_SQL, "limit": 2, "offset": 1, "skip_count": True},
        {"sql": PUBLIC_SQL, "unknown": 1},  # 422 invalid_request naming the field
        {"query": PUBLIC_SQL},  # the same: `sql` is the statement's field
        {"sql": "   "},  # sql_refused: missing statement
        {"sql": "DELETE FROM stats"},  # a refused statement
        {"sql": "SELECT id FROM nowhere"},  # an unknown table
    ],
)
async def test_qe01_both_doors_answer_alike(client: httpx.AsyncClient, body: dict[str, Any]) -> None:
    framework = _answer(await _post(client, body, FRAMEWORK))
    for content_type in PLAIN:
        assert _answer(await _post(client, body, content_type)) == framework, content_type
    if framework[0] == 200:
        assert framework[2]["items"] and framework[3] == "req-door"


async def test_qe01_malformed_bodies_keep_the_framework_answer(client: httpx.AsyncClient) -> None:
    """Bodies the fast path passes on: FastAPI's refusal, the service's code, as before."""
    not_json = await client.post("/query", content=b"{not json", headers={"content-type": "application/json"})
    assert (not_json.status_code, not_json.json()["error"]) == (400, "invalid_body")
    wrong_type = await client.post("/query", json={"sql": PUBLIC_SQL, "limit": "many"})
    assert (wrong_type.status_code, wrong_type.json()["error"]) == (422, "invalid_request")
    assert "limit" in wrong_type.json()["detail"]
    a_list = await client.post("/query", json=[PUBLIC_SQL])
    assert (a_list.status_code, a_list.json()["error"]) == (422, "invalid_request")
    text = await client.post("/query", content=PUBLIC_SQL.encode(), headers={"content-type": "text/plain"})
    assert (text.status_code, text.json()["error"]) == (422, "invalid_request")
    wrong_method = await client.get("/query")
    assert wrong_method.status_code == 405


class _Inner:
    """The app behind the fast path: records what it was handed, answers 204."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, bytes]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        self.seen.append((scope["path"], body))
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})


async def _through(door: QueryRoutes, path: str, chunks: list[bytes], content_type: bytes) -> None:
    messages: list[Message] = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)
    ]

    async def receive() -> Message:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(_: Message) -> None:
        return None

    headers = [(b"content-type", content_type)]
    scope: Scope = {"type": "http", "method": "POST", "path": path, "headers": headers}
    await door(scope, receive, send)


async def test_qe01_the_fast_path_passes_on_what_it_must_not_decide() -> None:
    inner = _Inner()
    door = QueryRoutes(inner, dps_enabled=False, state=None)
    await _through(door, "/query", [b'{"sql": "SELECT 1", "limit": "x"}'], b"application/json")
    await _through(door, "/query", [b"[1]"], b"application/json")
    await _through(door, "/query", [b'{"sql": "SELECT 1"}'], b"application/problem+json")
    await _through(door, "/query", [b""], b"application/json")
    # a body still arriving (no door read it whole) is the framework's to read
    await _through(door, "/query", [b'{"sql": ', b'"SELECT 1"}'], b"application/json")
    # DPS-01: without DPS the pull route is not the fast path's, whatever its body
    await _through(door, "/dps/public/query", [b'{"sql": "SELECT 1"}'], b"application/json")
    assert inner.seen == [
        ("/query", b'{"sql": "SELECT 1", "limit": "x"}'),
        ("/query", b"[1]"),
        ("/query", b'{"sql": "SELECT 1"}'),
        ("/query", b""),
        ("/query", b'{"sql": "SELECT 1"}'),
        ("/dps/public/query", b'{"sql": "SELECT 1"}'),
    ]


TRACE = "0af7651916cd43dd8448eb211c80319c"
PARENT = "b7ad6b7169203331"


@pytest.mark.parametrize(("status", "error"), [(200, False), (403, False), (503, True)])
async def test_qe01_the_plain_door_starts_the_server_span_in_the_callers_trace(
    status: int, error: bool
) -> None:
    """A request the fast path answers gets its SERVER span from the front door: child of the
    caller's traceparent, named by method and route, the status and the request id set, a 5xx an
    error."""
    from types import SimpleNamespace

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import SpanKind, StatusCode
    from starlette.responses import Response

    from dataplane_service_kit.errors import ServiceError
    from dataplane_service_kit.telemetry import REQUEST_ID_ATTRIBUTE, SERVER_SCOPE

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    fast = QueryRoutes(_Inner(), dps_enabled=False, state=SimpleNamespace(gateway=None))
    door = FrontDoor(fast, spans=ServerSpans({}, provider))

    async def answer(_gw: object, incoming: Any, _body: object) -> Response:
        assert incoming.headers["traceparent"].startswith("00-" + TRACE)
        if status == 503:
            raise ServiceError("audit_unavailable", "disclosure could not be recorded; no rows served")
        return Response(b"{}", status_code=status, media_type="application/json")

    fast.routes["/query"] = answer
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b'{"sql": "SELECT 1"}', "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    headers = [(b"content-type", b"application/json"), (b"traceparent", f"00-{TRACE}-{PARENT}-01".encode())]
    await door({"type": "http", "method": "POST", "path": "/query", "headers": headers}, receive, send)
    assert sent[0]["status"] == status
    [span] = exporter.get_finished_spans()
    assert span.instrumentation_scope is not None and span.instrumentation_scope.name == SERVER_SCOPE
    assert (span.name, span.kind) == ("POST /query", SpanKind.SERVER)
    assert format(span.context.trace_id, "032x") == TRACE
    assert span.parent is not None and format(span.parent.span_id, "016x") == PARENT
    assert span.attributes is not None and span.attributes["http.response.status_code"] == status
    assert span.attributes["http.route"] == "/query"
    assert span.attributes[REQUEST_ID_ATTRIBUTE] == dict(sent[0]["headers"])[b"x-request-id"].decode()
    assert (span.status.status_code == StatusCode.ERROR) is error


@pytest.mark.parametrize("traceparent", [None, f"00-{TRACE}-{PARENT}-01"])
async def test_gs01_the_access_record_carries_the_trace_of_the_server_span(traceparent: str | None) -> None:
    """The access context takes the trace id of the request's server span: the caller's trace when
    a traceparent came, the span's own new trace when none did (never null while tracing)."""
    from types import SimpleNamespace

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from starlette.responses import Response

    from query_gateway.deps import context as _context

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    fast = QueryRoutes(_Inner(), dps_enabled=False, state=SimpleNamespace(gateway=None))
    door = FrontDoor(fast, spans=ServerSpans({}, provider))
    seen: list[str | None] = []

    async def answer(_gw: object, incoming: Any, _body: object) -> Response:
        seen.append(_context(incoming, "POST", "/query").trace_id)
        return Response(b"{}", media_type="application/json")

    fast.routes["/query"] = answer

    async def receive() -> Message:
        return {"type": "http.request", "body": b'{"sql": "SELECT 1"}', "more_body": False}

    async def send(_message: Message) -> None:
        return None

    headers = [(b"content-type", b"application/json")]
    if traceparent is not None:
        headers.append((b"traceparent", traceparent.encode()))
    await door({"type": "http", "method": "POST", "path": "/query", "headers": headers}, receive, send)
    [span] = exporter.get_finished_spans()
    assert seen == [format(span.context.trace_id, "032x")]
    if traceparent is not None:
        assert seen == [TRACE]


@pytest.mark.parametrize("route", ["/query", "/query/plan"])
async def test_qe01_a_fault_of_ours_is_500_internal_error_with_the_request_id(route: str) -> None:
    """A gateway that cannot answer at all (its state holds no gateway: every attribute it reads
    fails) answers a coded problem carrying the request's id, never the server's bare 500."""
    from types import SimpleNamespace

    fast = QueryRoutes(_Inner(), dps_enabled=False, state=SimpleNamespace(gateway=None))
    door = FrontDoor(fast, spans=ServerSpans({"OTEL_SDK_DISABLED": "true"}))
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b'{"sql": "SELECT 1"}', "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    headers = [(b"content-type", b"application/json"), (b"x-request-id", b"req-fault")]
    await door({"type": "http", "method": "POST", "path": route, "headers": headers}, receive, send)
    start, body = sent[0], sent[1]
    assert start["status"] == 500
    assert dict(start["headers"])[b"x-request-id"] == b"req-fault"
    assert json.loads(body["body"])["error"] == "internal_error"
