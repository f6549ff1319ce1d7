"""OpenTelemetry set-up in one place: providers from the standard OTEL_* variables, auto
instrumentation of the libraries the services use, and W3C trace context for Kafka headers."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

from fastapi import FastAPI
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

_configured = False


def setup_telemetry(service_name: str) -> None:
    """Install a tracer provider once per process; export over OTLP only when an endpoint is set."""
    global _configured  # noqa: PLW0603 - the provider is process-wide by nature
    if _configured:
        return
    _configured = True
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", service_name)})
    provider = TracerProvider(resource=resource)
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    _instrument_libraries()


def _instrument_libraries() -> None:
    from opentelemetry.instrumentation.aiokafka import AIOKafkaInstrumentor
    from opentelemetry.instrumentation.asyncpg import AsyncPGInstrumentor
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
    from opentelemetry.instrumentation.redis import RedisInstrumentor

    HTTPXClientInstrumentor().instrument()
    AsyncPGInstrumentor().instrument()  # type: ignore[no-untyped-call]
    RedisInstrumentor().instrument()
    # publish and consume spans; it appends its own traceparent after ours (see below)
    AIOKafkaInstrumentor().instrument()


def instrument_app(app: FastAPI) -> None:
    """Server spans for every HTTP request except the probes and the scrape."""
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    FastAPIInstrumentor.instrument_app(app, excluded_urls="healthz,readyz,metrics")


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
