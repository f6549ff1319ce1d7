"""OpenTelemetry set-up in one place: providers from the standard OTEL_* variables, auto
instrumentation of the libraries the services use, and W3C trace context for Kafka headers.

The standard variables honoured, and how:

- `OTEL_SDK_DISABLED=true`: no tracer provider and no instrumentation at all.
- `OTEL_TRACES_EXPORTER`: `otlp` exports (to the SDK's default endpoint if none is set), `none`
  traces without exporting; unset, spans are exported only when an OTLP endpoint is set.
- `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`, else `OTEL_EXPORTER_OTLP_PROTOCOL`: only `http/protobuf`,
  the one exporter installed. Any other value (or exporter) stops the service at start-up with
  exit 2 naming the variable, as a wrong setting does: it must not silently send another protocol.
- `OTEL_EXPORTER_OTLP_*ENDPOINT`, `_HEADERS`, `_TIMEOUT`, `OTEL_SERVICE_NAME`,
  `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER`, `OTEL_BSP_*`: read by the SDK itself.
- No exporter and no `OTEL_TRACES_SAMPLER`: spans are recorded only in a trace the caller sampled
  (`parentbased_always_off`); trace ids are made and propagated all the same."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from fastapi.telemetry import TelemetryConfig
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace import Span as SdkSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased, Sampler
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from dataplane_service_kit.settings import ConfigurationError

SUPPORTED_PROTOCOL = "http/protobuf"
SUPPORTED_EXPORTERS = ("otlp", "none")

_configured = False


@dataclass(frozen=True)
class TracingPlan:
    """What the environment asks for: a tracer provider (and instrumentation) at all; an exporter."""

    enabled: bool
    export: bool


class UnsupportedTelemetry(ValueError):
    """An OTEL_* variable names something this service cannot do; the message names the variable."""


def _get(environ: Mapping[str, str], name: str) -> str:
    # the specification treats an empty value as unset
    return environ.get(name, "").strip()


def sdk_disabled(environ: Mapping[str, str]) -> bool:
    return _get(environ, "OTEL_SDK_DISABLED").lower() == "true"


def tracing_plan(environ: Mapping[str, str]) -> TracingPlan:
    """Decide from the standard variables; UnsupportedTelemetry for a value we cannot honour."""
    if sdk_disabled(environ):
        return TracingPlan(enabled=False, export=False)
    exporter = _get(environ, "OTEL_TRACES_EXPORTER").lower()
    if exporter and exporter not in SUPPORTED_EXPORTERS:
        raise UnsupportedTelemetry(
            f"OTEL_TRACES_EXPORTER: {exporter!r} is not supported; "
            f"use one of {', '.join(SUPPORTED_EXPORTERS)}"
        )
    if exporter == "none":
        return TracingPlan(enabled=True, export=False)
    # the signal-specific variable wins over the general one, as in the specification
    for name in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        protocol = _get(environ, name)
        if protocol:
            if protocol != SUPPORTED_PROTOCOL:
                raise UnsupportedTelemetry(
                    f"{name}: {protocol!r} is not supported; spans are exported over OTLP/HTTP "
                    f"with {SUPPORTED_PROTOCOL} only"
                )
            break
    endpoint = bool(
        _get(environ, "OTEL_EXPORTER_OTLP_ENDPOINT") or _get(environ, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )
    # unset exporter: no endpoint means nobody to send to (local runs), so no failing exports
    return TracingPlan(enabled=True, export=exporter == "otlp" or endpoint)


def setup_telemetry(service_name: str, environ: Mapping[str, str] | None = None) -> None:
    """Install a tracer provider once per process as the OTEL_* variables say (module docstring);
    exit 2 naming the variable when one of them asks for something unsupported."""
    global _configured  # noqa: PLW0603 - the provider is process-wide by nature
    if _configured:
        return
    env = os.environ if environ is None else environ
    try:
        plan = tracing_plan(env)
    except UnsupportedTelemetry as exc:
        print(f"invalid configuration: {exc}", file=sys.stderr)
        raise ConfigurationError(2) from None
    _configured = True
    if not plan.enabled:
        return
    resource = Resource.create({"service.name": env.get("OTEL_SERVICE_NAME") or service_name})
    provider = TracerProvider(resource=resource, sampler=_default_sampler(plan, env))
    provider.add_span_processor(SqlSpanNames())  # first: the exporter reads the name at the end
    if plan.export:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    _instrument_libraries()


# the span name of a statement that opens with no SQL word: the database system, as the database
# semantic conventions name a span when there is no operation to name
SQL_FALLBACK_SPAN_NAME = "postgresql"
_ASYNCPG_SCOPE = "opentelemetry.instrumentation.asyncpg"


def sql_span_name(name: str) -> str:
    """The asyncpg instrumentation names a span after the statement's first whitespace-separated
    token, so SQLAlchemy's pool pre-ping (the statement `;`) made a span named `;`, and `select`
    and `SELECT` two names. An SQL word (SELECT, SET, BEGIN) is the name in upper case; anything
    else is the fallback name."""
    return name.upper() if name.isalpha() else SQL_FALLBACK_SPAN_NAME


class SqlSpanNames(SpanProcessor):
    """Gives every asyncpg span a stable name (`sql_span_name`) as it starts."""

    def on_start(self, span: SdkSpan, parent_context: Context | None = None) -> None:
        scope = span.instrumentation_scope
        if scope is not None and scope.name.startswith(_ASYNCPG_SCOPE):
            renamed = sql_span_name(span.name)
            if renamed != span.name:
                span.update_name(renamed)

    def on_end(self, span: ReadableSpan) -> None:
        return None


def _default_sampler(plan: TracingPlan, env: Mapping[str, str]) -> Sampler | None:
    """With nobody to export to, a span is recorded only when the caller's trace is sampled:
    recording a span per request that no one receives cost about 40 µs of a request's CPU. Trace
    ids are still made, carried into logs and propagated either way. OTEL_TRACES_SAMPLER, when set,
    decides as the specification says (None: the SDK reads it)."""
    if plan.export or _get(env, "OTEL_TRACES_SAMPLER"):
        return None
    return ParentBased(ALWAYS_OFF)


def _instrument_libraries() -> None:
    from opentelemetry.instrumentation.aiohttp_client import AioHttpClientInstrumentor
    from opentelemetry.instrumentation.aiokafka import AIOKafkaInstrumentor
    from opentelemetry.instrumentation.asyncpg import AsyncPGInstrumentor
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
    from opentelemetry.instrumentation.redis import RedisInstrumentor

    HTTPXClientInstrumentor().instrument()
    AioHttpClientInstrumentor().instrument()  # the relay's posts to ds
    AsyncPGInstrumentor().instrument()  # type: ignore[no-untyped-call]
    RedisInstrumentor().instrument()
    # publish and consume spans; it appends its own traceparent after ours (see below)
    AIOKafkaInstrumentor().instrument()


# FastAPI's own telemetry (its spans, metrics and log records per request), switched off: the
# front door makes the server spans (`ServerSpans`), and a second set of per-request spans beside
# them cost a sixth of the gateway's CPU per request and told nothing more.
FASTAPI_TELEMETRY: TelemetryConfig = {
    "tracing": False,
    "metrics": False,
    "logs": False,
    "operation_spans": False,
    "auto_configure": False,
}


# the instrumentation scope of the server spans the front door starts (ServerSpans)
SERVER_SCOPE = "dataplane.server"
# the request's id on its span: the span and the access records of one request are found by it
REQUEST_ID_ATTRIBUTE = "dataplane.request_id"


class ServerSpans:
    """The SERVER span of every request the front door lets in (probes and the scrape excepted):
    the caller's W3C context extracted from the headers, the method and the request id at the
    start, the route template and status once the answer is known (`answered`). Nothing at all
    when the SDK is disabled."""

    def __init__(
        self, environ: Mapping[str, str] | None = None, provider: trace.TracerProvider | None = None
    ) -> None:
        env = os.environ if environ is None else environ
        self._tracer = None if sdk_disabled(env) else trace.get_tracer(SERVER_SCOPE, tracer_provider=provider)

    @contextlib.contextmanager
    def span(self, method: str, headers: Mapping[str, str], request_id: str) -> Iterator[Span | None]:
        """`headers`: lower-case names, one value each (what the W3C propagator reads)."""
        if self._tracer is None:
            yield None
            return
        with self._tracer.start_as_current_span(
            method,
            context=propagate.extract(headers),
            kind=SpanKind.SERVER,
            attributes={"http.request.method": method, REQUEST_ID_ATTRIBUTE: request_id},
            # the door answers every fault itself; a span never records an exception's message
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            yield span


def answered(span: Span | None, method: str, route: str, status: int) -> None:
    """The route template (the span's name is `METHOD route`, as the HTTP conventions name a
    server span) and the response status on a server span; a 5xx marks the span as an error."""
    if span is None or not span.is_recording():
        return
    span.update_name(f"{method} {route}")
    span.set_attribute("http.route", route)
    span.set_attribute("http.response.status_code", status)
    if status >= 500:
        span.set_status(Status(StatusCode.ERROR))


def shutdown_telemetry() -> None:
    provider = trace.get_tracer_provider()
    shutdown = getattr(provider, "shutdown", None)
    if callable(shutdown):
        shutdown()


def kafka_headers() -> list[tuple[str, bytes]]:
    """The current trace context as Kafka record headers (traceparent, tracestate)."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return [(k, v.encode()) for k, v in carrier.items()]


def context_from_kafka_headers(
    headers: Iterable[tuple[str, bytes]] | Sequence[tuple[str, bytes]] | None,
) -> object:
    """Extract the producer's trace context so consumer spans join the same trace.

    The first occurrence of a header wins: it is the context the event was created in (an outbox
    row keeps its request's context), ahead of one the publishing instrumentation appended."""
    carrier: dict[str, str] = {}
    for k, v in headers or []:
        carrier.setdefault(k, v.decode(errors="replace"))
    return propagate.extract(carrier)
