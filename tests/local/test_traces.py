"""The OTLP receiver double keeps what it receives in the stack's span store, and `dataplane-local
traces` draws the stored requests as a waterfall: real OTLP/HTTP protobuf exports over a socket,
the store file read back by the command's own code."""

from __future__ import annotations

import gzip
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from dataplane_local import traces
from dataplane_local.doubles.otlp_receiver import OtlpReceiver, create_app
from dataplane_local.doubles.server import RunningServer, serve_in_thread
from dataplane_local.stack import TRACES_FILE

T0 = 1_700_000_000_000_000_000
REQUEST = bytes.fromhex("0af7651916cd43dd8448eb211c80319c")
BACKGROUND = bytes.fromhex("4bf92f3577b34da6a3ce929d0e0e4736")
ATTRIBUTE_KEYS = {
    "http_route": "http.route",
    "http_response_status_code": "http.response.status_code",
    "http_status_code": "http.status_code",
    "db_statement": "db.statement",
}


def _attr(key: str, value: str | int) -> KeyValue:
    any_value = AnyValue(int_value=value) if isinstance(value, int) else AnyValue(string_value=value)
    return KeyValue(key=key, value=any_value)


def _span(
    trace: bytes,
    ids: tuple[int, int | None],
    name: str,
    kind: int,
    ms: tuple[float, float],
    **attrs: str | int,
) -> Span:
    span, parent = ids
    start_ms, end_ms = ms
    return Span(
        trace_id=trace,
        span_id=span.to_bytes(8, "big"),
        parent_span_id=parent.to_bytes(8, "big") if parent else b"",
        name=name,
        kind=kind,  # type: ignore[arg-type]
        start_time_unix_nano=T0 + int(start_ms * 1e6),
        end_time_unix_nano=T0 + int(end_ms * 1e6),
        attributes=[_attr(ATTRIBUTE_KEYS[k], v) for k, v in attrs.items()],
    )


def _export(service: str, *spans: Span) -> bytes:
    request = ExportTraceServiceRequest(
        resource_spans=[
            ResourceSpans(
                resource={"attributes": [_attr("service.name", service)]},  # type: ignore[arg-type]
                scope_spans=[ScopeSpans(spans=list(spans))],
            )
        ]
    )
    return request.SerializeToString()


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[tuple[OtlpReceiver, RunningServer, Path]]:
    store = tmp_path / "stack" / TRACES_FILE
    state = OtlpReceiver(store)
    server = serve_in_thread(create_app(state))
    yield state, server, tmp_path / "stack"
    server.stop()


def _post(url: str, payload: bytes, gzipped: bool = False) -> httpx.Response:
    headers = {"content-type": "application/x-protobuf"}
    if gzipped:
        payload, headers["content-encoding"] = gzip.compress(payload), "gzip"
    return httpx.post(f"{url}/v1/traces", content=payload, headers=headers)


def _send_a_request_trace(url: str) -> None:
    # a gateway request that asked the resolver over Kafka and published a disclosure the relay
    # delivered; each service exports its own batch, as the real ones do
    gateway = _export(
        "query-gateway",
        _span(
            REQUEST,
            (1, None),
            "POST /dps/public/query",
            2,
            (0, 40),
            http_route="/dps/public/query",
            http_response_status_code=200,
        ),
        _span(REQUEST, (2, 1), "dataplane.plan.requests send", 4, (5, 6)),
        _span(REQUEST, (5, 1), "SELECT", 3, (30, 35), db_statement="SELECT secret FROM t"),
    )
    resolver = _export(
        "filter-resolver",
        _span(REQUEST, (3, 2), "plan_request process", 5, (7, 25)),
        _span(REQUEST, (4, 3), "row_filter.resolve", 1, (8, 24)),
    )
    relay = _export(
        "audit-relay", _span(REQUEST, (6, 1), "audit_relay.post", 3, (45, 60), http_status_code=200)
    )
    background = _export("signaling", _span(BACKGROUND, (9, None), "SELECT", 3, (70, 71)))
    for payload in (gateway, resolver, relay):
        assert _post(url, payload).status_code == 200
    assert _post(url, background, gzipped=True).status_code == 200


def test_the_receiver_stores_spans_and_traces_draws_the_request_as_a_waterfall(
    receiver: tuple[OtlpReceiver, RunningServer, Path],
) -> None:
    state, server, root = receiver
    _send_a_request_trace(server.url)
    stored = traces.load_spans(root / TRACES_FILE)
    assert len(stored) == len(state.spans()) == 7
    by_name = {s.name: s for s in stored}
    assert by_name["POST /dps/public/query"].attributes == {
        "http.route": "/dps/public/query",
        "http.response.status_code": "200",
    }
    assert by_name["SELECT"].attributes == {}  # the statement is not kept
    assert by_name["row_filter.resolve"].end_ns - by_name["row_filter.resolve"].start_ns == 16_000_000

    text = traces.render(stored, count=5, width=20)
    lines = text.splitlines()
    # only the request: the background trace has no server span
    assert lines[0].startswith(f"trace {REQUEST.hex()}  60.0 ms  6 spans")
    assert "services: gateway, relay, resolver" in lines[0]
    assert BACKGROUND.hex() not in text
    rows = [line.split("|")[0].split() for line in lines[1:]]
    assert [r[0] for r in rows] == ["gateway", "gateway", "resolver", "resolver", "gateway", "relay"]
    # call order, a child under its parent: the resolver's work nests under the gateway's send
    assert lines[1].split()[1:4] == ["POST", "/dps/public/query", "→"]
    assert "    plan_request process" in lines[3] and "      row_filter.resolve" in lines[4]
    # bars on the trace's time axis: the server span covers 0..40 of 60 ms, the relay's post 45..60
    bars = [line.split("|")[1] for line in lines[1:]]
    assert bars[0] == "█" * 13 + " " * 7
    assert bars[-1] == " " * 15 + "█" * 5
    assert lines[-1].rstrip().endswith("15.00 ms")


def test_traces_command_reads_the_state_directory_and_skips_a_half_written_line(
    receiver: tuple[OtlpReceiver, RunningServer, Path],
) -> None:
    _, server, root = receiver
    cli = [sys.executable, "-m", "dataplane_local.cli", "--dir", str(root), "traces", "--width", "20"]
    (root / TRACES_FILE).parent.mkdir(parents=True, exist_ok=True)
    (root / TRACES_FILE).write_text("")
    empty = subprocess.run(cli, capture_output=True, text=True, timeout=60, check=False)
    assert empty.returncode == 0 and "no spans received yet" in empty.stdout
    _send_a_request_trace(server.url)
    with (root / TRACES_FILE).open("a") as store:
        store.write('{"trace_id": "ab", "span_')  # a write caught half-way
    drawn = subprocess.run(cli, capture_output=True, text=True, timeout=60, check=False)
    assert drawn.returncode == 0, drawn.stderr
    assert drawn.stdout.startswith(f"trace {REQUEST.hex()}") and "row_filter.resolve" in drawn.stdout
    one = subprocess.run(
        [*cli, "--trace", BACKGROUND.hex()], capture_output=True, text=True, timeout=60, check=False
    )
    assert BACKGROUND.hex() in one.stdout and REQUEST.hex() not in one.stdout
    missing = subprocess.run(
        [sys.executable, "-m", "dataplane_local.cli", "--dir", str(root / "nothing"), "traces"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert missing.returncode == 2 and "is the local stack running" in missing.stdout


def test_the_store_rotates_past_its_bound_keeping_one_older_generation(tmp_path: Path) -> None:
    store = tmp_path / TRACES_FILE
    server = serve_in_thread(create_app(OtlpReceiver(store, max_bytes=1)))
    try:
        _send_a_request_trace(server.url)  # four batches: gateway 3 spans, resolver 2, relay 1, signaling 1
    finally:
        server.stop()
    assert store.with_name(store.name + ".1").exists()
    # every batch past the bound moved the file aside: the last two batches are what is left
    assert sorted(s.service_name for s in traces.load_spans(store)) == ["audit-relay", "signaling"]
