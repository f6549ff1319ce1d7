"""Issue 7, "OTLP export configured by the standard OTEL_* variables": the telemetry set-up honours
OTEL_SDK_DISABLED, OTEL_TRACES_EXPORTER and the OTLP protocol variables, and refuses (exit 2, the
variable named) a protocol or exporter it cannot honour instead of silently sending another one.

Each case runs setup_telemetry in its own process: the tracer provider and the library
instrumentation are process-wide, so they must not leak into (or from) this test process."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from dataplane_local.doubles.otlp_receiver import OtlpReceiver, create_app
from dataplane_local.doubles.server import RunningServer, serve_in_thread
from dataplane_service_kit.telemetry import TracingPlan, UnsupportedTelemetry, tracing_plan

# One span, then shutdown: BatchSpanProcessor flushes on shutdown, so any export has reached the
# receiver (and been answered) before the process exits; no waiting on a schedule is needed.
PROBE = """
from opentelemetry import trace
from dataplane_service_kit.telemetry import setup_telemetry, shutdown_telemetry
setup_telemetry("telemetry-probe")
with trace.get_tracer("probe").start_as_current_span("probe-span"):
    pass
print(type(trace.get_tracer_provider()).__name__)
from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
print("httpx-instrumented" if HTTPXClientInstrumentor().is_instrumented_by_opentelemetry else "plain")
shutdown_telemetry()
"""

OTEL_VARS = (
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
)


@pytest.fixture
def receiver() -> Iterator[tuple[OtlpReceiver, RunningServer]]:
    state = OtlpReceiver()
    server = serve_in_thread(create_app(state))
    try:
        yield state, server
    finally:
        server.stop()


def run_probe(**env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in OTEL_VARS}
    return subprocess.run(
        [sys.executable, "-c", PROBE],
        env={**base, **env},
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("env", "plan"),
    [
        ({}, TracingPlan(enabled=True, export=False)),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, TracingPlan(enabled=True, export=True)),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, TracingPlan(True, True)),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, TracingPlan(enabled=True, export=True)),
        (
            {"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"},
            TracingPlan(True, False),
        ),
        (
            {"OTEL_SDK_DISABLED": "TRUE", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"},
            TracingPlan(False, False),
        ),
        ({"OTEL_SDK_DISABLED": "false"}, TracingPlan(enabled=True, export=False)),
        # a protocol nobody exports with is irrelevant when nothing is traced or exported
        ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, TracingPlan(False, False)),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, TracingPlan(True, False)),
        # the traces-specific protocol wins over the general one
        (
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            },
            TracingPlan(enabled=True, export=True),
        ),
    ],
)
def test_otel_variables_decide_tracing_and_export(env: dict[str, str], plan: TracingPlan) -> None:
    assert tracing_plan(env) == plan


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "OTEL_EXPORTER_OTLP_PROTOCOL"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "OTEL_EXPORTER_OTLP_PROTOCOL"),
        (
            {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"},
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        ),
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER"),
        ({"OTEL_TRACES_EXPORTER": "otlp,console"}, "OTEL_TRACES_EXPORTER"),
    ],
)
def test_unsupported_protocol_or_exporter_refused_naming_the_variable(
    env: dict[str, str], variable: str
) -> None:
    with pytest.raises(UnsupportedTelemetry, match=f"^{variable}: "):
        tracing_plan({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", **env})


def test_unsupported_protocol_stops_the_process_with_exit_2() -> None:
    run = run_probe(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9", OTEL_EXPORTER_OTLP_PROTOCOL="grpc")
    assert run.returncode == 2, run.stderr
    assert "invalid configuration: OTEL_EXPORTER_OTLP_PROTOCOL: 'grpc' is not supported" in run.stderr
    assert "probe" not in run.stdout  # it never got as far as tracing


def test_endpoint_set_exports_spans_over_otlp_http(receiver: tuple[OtlpReceiver, RunningServer]) -> None:
    state, server = receiver
    run = run_probe(OTEL_EXPORTER_OTLP_ENDPOINT=server.url, OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf")
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["TracerProvider", "httpx-instrumented"]
    assert [s.name for s in state.spans(service="telemetry-probe")] == ["probe-span"]


def test_traces_exporter_none_traces_without_exporting(receiver: tuple[OtlpReceiver, RunningServer]) -> None:
    state, server = receiver
    run = run_probe(OTEL_EXPORTER_OTLP_ENDPOINT=server.url, OTEL_TRACES_EXPORTER="none")
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["TracerProvider", "httpx-instrumented"]
    assert state.requests == 0 and state.spans() == []


def test_sdk_disabled_sets_up_no_tracing(receiver: tuple[OtlpReceiver, RunningServer]) -> None:
    state, server = receiver
    run = run_probe(OTEL_EXPORTER_OTLP_ENDPOINT=server.url, OTEL_SDK_DISABLED="true")
    assert run.returncode == 0, run.stderr
    # the API's default (no-op) provider, and no library instrumented
    assert run.stdout.split() == ["ProxyTracerProvider", "plain"]
    assert state.requests == 0 and state.spans() == []


SAMPLING_PROBE = """
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, set_span_in_context
from dataplane_service_kit.telemetry import setup_telemetry
setup_telemetry("telemetry-probe")
tracer = trace.get_tracer("probe")
with tracer.start_as_current_span("root") as root:
    print("root", root.is_recording(), root.get_span_context().is_valid)
parent = NonRecordingSpan(SpanContext(0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, True,
                                      TraceFlags(TraceFlags.SAMPLED)))
with tracer.start_as_current_span("child", context=set_span_in_context(parent)) as child:
    print("sampled-parent", child.is_recording())
"""


@pytest.mark.parametrize(
    ("env", "root_recorded"),
    [
        ({}, False),  # nobody to export to: only a caller's sampled trace is recorded
        ({"OTEL_TRACES_SAMPLER": "always_on"}, True),  # the operator's sampler decides
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}, True),
    ],
)
def test_without_an_exporter_only_sampled_traces_are_recorded(
    env: dict[str, str], root_recorded: bool
) -> None:
    base = {k: v for k, v in os.environ.items() if k not in (*OTEL_VARS, "OTEL_TRACES_SAMPLER")}
    done = subprocess.run(
        [sys.executable, "-c", SAMPLING_PROBE],
        env={**base, **env},
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split("\n")
    assert f"root {root_recorded} True" in lines  # a trace id either way
    assert "sampled-parent True" in lines


async def test_sql_spans_get_a_stable_name_and_the_pre_ping_is_not_named_semicolon(postgres_url: str) -> None:
    """SQLAlchemy's asyncpg pre-ping sends `;`, which the asyncpg instrumentation named `;`; with
    the service kit's processor a statement's span is its SQL word, or `postgresql`."""
    import asyncpg
    from opentelemetry.instrumentation.asyncpg import AsyncPGInstrumentor
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from dataplane_service_kit.telemetry import SqlSpanNames

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SqlSpanNames())
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instrumentor = AsyncPGInstrumentor()
    instrumentor.instrument(tracer_provider=provider)  # type: ignore[no-untyped-call]
    try:
        conn = await asyncpg.connect(postgres_url)
        try:
            await conn.fetchrow(";")
            await conn.fetchval("SELECT 1")
            await conn.fetchval("/* a comment */ select 2")
        finally:
            await conn.close()
    finally:
        instrumentor.uninstrument()  # type: ignore[no-untyped-call]
    assert [s.name for s in exporter.get_finished_spans()] == ["postgresql", "SELECT", "SELECT"]
