"""DEVELOPMENT DOUBLE of an OpenTelemetry collector: a small real OTLP/HTTP receiver, never deployed.

- `POST /v1/traces` — an OTLP/HTTP protobuf `ExportTraceServiceRequest` (optionally gzip), decoded
  with `opentelemetry-proto`; every span is recorded as trace id, span id, parent span id (hex),
  name, kind and the `service.name` of its resource; answers an empty `ExportTraceServiceResponse`.
- `GET /_spans[?trace_id=&service=]` — the recorded spans as JSON.
- `POST /_control {"action": "clear"}` — forget every span.

With a store file (`--config` `{store: PATH}`, as `dataplane-local up` starts it) every span is
also appended to that file as one JSON line, with its start and end times, status and a few
attributes (route, request id, method, status code, messaging destination, the origin of an outgoing call's
URL): `dataplane-local traces` reads it. The file is rotated once it passes `STORE_MAX_BYTES`
(32 MiB; one older generation kept, `PATH.1`), so a long-running local stack does not fill the
disk.

Point a service at it with `OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:PORT` (the exporter adds
`/v1/traces`). In tests: `receiver = OtlpReceiver(); server = serve_in_thread(create_app(receiver))`;
as a process: `python -m dataplane_local.doubles.otlp_receiver --port N`."""

from __future__ import annotations

import gzip
import json
import threading
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from google.protobuf.message import DecodeError  # type: ignore[import-untyped]
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from dataplane_local.doubles._common import run_main

PROTOBUF = "application/x-protobuf"
STORE_MAX_BYTES = 32 * 1024 * 1024
# the attributes kept with a span: what a waterfall labels a span with, nothing that could carry a
# principal, key or token (no URL with its query, no SQL, no header)
KEPT_ATTRIBUTES = (
    "http.route",
    "dataplane.request_id",  # the front door's server spans: the id the answer and the logs carry
    "http.method",
    "http.request.method",
    "http.status_code",
    "http.response.status_code",
    "messaging.destination.name",
    "messaging.destination",
    "db.system",
    "server.address",
    "server.port",
    "net.peer.name",
    "net.peer.port",
)
URL_ATTRIBUTES = ("http.url", "url.full")


@dataclass(frozen=True)
class SpanRecord:
    trace_id: str
    span_id: str
    parent_span_id: str  # "" for a root span
    name: str
    kind: int
    service_name: str
    scope: str
    start_ns: int = 0
    end_ns: int = 0
    status: int = 0  # OTLP status code: 0 unset, 1 ok, 2 error
    attributes: dict[str, str] = field(default_factory=dict)


def _attribute_text(value: Any) -> str:
    kind = value.WhichOneof("value")
    return "" if kind is None else str(getattr(value, kind))


def _kept_attributes(attributes: Any) -> dict[str, str]:
    kept = {a.key: _attribute_text(a.value) for a in attributes if a.key in KEPT_ATTRIBUTES}
    for a in attributes:
        if a.key in URL_ATTRIBUTES:
            # whom an outgoing call went to: the URL's origin only — its path and query may carry
            # a participant, an id or a key
            parts = urlsplit(_attribute_text(a.value))
            if parts.scheme and parts.netloc:
                kept["peer"] = f"{parts.scheme}://{parts.netloc.rsplit('@', 1)[-1]}"
    return kept


class OtlpReceiver:
    """The spans received so far; touched by the server thread and the test thread, so locked."""

    def __init__(self, store: Path | None = None, max_bytes: int = STORE_MAX_BYTES) -> None:
        self._lock = threading.Lock()
        self._spans: list[SpanRecord] = []
        self.requests = 0
        self.store = store
        self.max_bytes = max_bytes
        if store is not None:
            store.parent.mkdir(parents=True, exist_ok=True)

    def ingest(self, payload: bytes) -> int:
        request = ExportTraceServiceRequest()
        request.ParseFromString(payload)
        found: list[SpanRecord] = []
        for resource_spans in request.resource_spans:
            service = ""
            for attr in resource_spans.resource.attributes:
                if attr.key == "service.name":
                    service = attr.value.string_value
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    found.append(
                        SpanRecord(
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            name=span.name,
                            kind=int(span.kind),
                            service_name=service,
                            scope=scope_spans.scope.name,
                            start_ns=int(span.start_time_unix_nano),
                            end_ns=int(span.end_time_unix_nano),
                            status=int(span.status.code),
                            attributes=_kept_attributes(span.attributes),
                        )
                    )
        with self._lock:
            self._spans.extend(found)
            self.requests += 1
            if self.store is not None and found:
                self._append(found)
        return len(found)

    def _append(self, spans: list[SpanRecord]) -> None:
        store = self.store
        assert store is not None
        if store.exists() and store.stat().st_size > self.max_bytes:
            store.replace(store.with_name(store.name + ".1"))
        # one write per batch, whole lines only: a reader never sees half a span but the last line
        lines = "".join(json.dumps(asdict(s), separators=(",", ":")) + "\n" for s in spans)
        with store.open("a", encoding="utf-8") as out:
            out.write(lines)

    def spans(self, trace_id: str | None = None, service: str | None = None) -> list[SpanRecord]:
        with self._lock:
            return [
                s
                for s in self._spans
                if (trace_id is None or s.trace_id == trace_id)
                and (service is None or s.service_name == service)
            ]

    def clear(self) -> None:
        with self._lock:
            self._spans.clear()
            self.requests = 0


def _decompress(raw: bytes, encoding: str) -> bytes:
    encoding = encoding.strip().lower()
    if encoding == "gzip":
        return gzip.decompress(raw)
    if encoding == "deflate":
        return zlib.decompress(raw)
    return raw


def create_app(state: OtlpReceiver) -> FastAPI:
    app = FastAPI(title="OTLP receiver DEVELOPMENT DOUBLE")
    app.state.receiver = state

    @app.post("/v1/traces")
    async def traces(request: Request) -> Response:
        content_type = request.headers.get("content-type", "").split(";")[0].strip()
        if content_type != PROTOBUF:
            # the JSON encoding exists too, but no exporter here sends it: say so instead of guessing
            return JSONResponse({"detail": f"only {PROTOBUF} is accepted"}, status_code=415)
        try:
            payload = _decompress(await request.body(), request.headers.get("content-encoding", ""))
            state.ingest(payload)
        except (DecodeError, OSError, zlib.error) as exc:
            return JSONResponse({"detail": f"unreadable OTLP payload: {exc}"}, status_code=400)
        return Response(ExportTraceServiceResponse().SerializeToString(), media_type=PROTOBUF)

    @app.get("/_spans")
    def list_spans(trace_id: str | None = None, service: str | None = None) -> list[dict[str, Any]]:
        return [asdict(s) for s in state.spans(trace_id, service)]

    @app.post("/_control")
    async def control(request: Request) -> Response:
        body = await request.json()
        if not isinstance(body, dict) or body.get("action") != "clear":
            return JSONResponse({"detail": "the only action is 'clear'"}, status_code=422)
        state.clear()
        return JSONResponse({"ok": True})

    return app


def build(config: dict[str, Any]) -> FastAPI:
    store = config.get("store")
    return create_app(OtlpReceiver(Path(store) if store else None))


def main(argv: list[str] | None = None) -> None:
    run_main("otlp_receiver", build, argv)


if __name__ == "__main__":
    main()
