"""`dataplane-local traces`: the last requests as a text waterfall across the services.

The stack's OTLP receiver (`doubles/otlp_receiver.py`) appends every span the services export to
`<state dir>/traces/spans.jsonl`; this module reads that file back, groups the spans by trace,
orders each trace as its call tree (a child under its parent, siblings by start time) and draws
one bar per span on a common time axis, so a request's path — gateway, resolver over Kafka,
relay, signaling — and where its time went can be read at a glance."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, fields
from pathlib import Path

from dataplane_local.doubles.otlp_receiver import SpanRecord
from dataplane_local.stack import TRACES_FILE

_FIELDS = {f.name for f in fields(SpanRecord)}
# OTLP span kinds, as the waterfall labels them
_KINDS = {1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}
_SHORT = {"query-gateway": "gateway", "filter-resolver": "resolver", "audit-relay": "relay"}


def store_files(path: Path) -> list[Path]:
    """The span store and its older generation (rotated by the receiver), oldest first."""
    return [p for p in (path.with_name(path.name + ".1"), path) if p.exists()]


def load_spans(path: Path) -> list[SpanRecord]:
    """Every span stored at `path` (and its rotated generation). A line that does not parse — the
    receiver's last write caught half-way — is skipped, never guessed at."""
    spans: list[SpanRecord] = []
    for file in store_files(path):
        for line in file.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                data = json.loads(line)
            except ValueError:
                continue
            if isinstance(data, dict) and set(data) <= _FIELDS and "trace_id" in data:
                spans.append(SpanRecord(**data))
    return spans


@dataclass(frozen=True)
class StoredSpans:
    """The stack's span store read like the in-process receiver (`spans(trace_id, service)`)."""

    path: Path

    def spans(self, trace_id: str | None = None, service: str | None = None) -> list[SpanRecord]:
        return [
            s
            for s in load_spans(self.path)
            if (trace_id is None or s.trace_id == trace_id) and (service is None or s.service_name == service)
        ]


SERVER = 2  # OTLP SpanKind SERVER: a request some caller made to a service
CLIENT = 3  # OTLP SpanKind CLIENT: a call a service made


def last_traces(spans: Iterable[SpanRecord], count: int) -> list[list[SpanRecord]]:
    """The `count` requests that started last, oldest first, each the list of its trace's spans. A
    request is a trace holding a server span; a trace without one is a service's own background
    work (an outbox poll, a consumer's fetch) and is left out."""
    by_trace: dict[str, list[SpanRecord]] = defaultdict(list)
    for span in spans:
        by_trace[span.trace_id].append(span)
    requests = [t for t in by_trace.values() if any(s.kind == SERVER for s in t)]
    ordered = sorted(requests, key=lambda t: min(s.start_ns for s in t))
    return ordered[-count:] if count > 0 else []


def call_tree(trace: list[SpanRecord]) -> list[tuple[int, SpanRecord]]:
    """(depth, span) in call order. A span whose parent was not received (a caller outside the
    stack, or a batch not exported yet) starts a tree of its own."""
    ids = {s.span_id for s in trace}
    children: dict[str, list[SpanRecord]] = defaultdict(list)
    roots: list[SpanRecord] = []
    for span in trace:
        if span.parent_span_id and span.parent_span_id in ids and span.parent_span_id != span.span_id:
            children[span.parent_span_id].append(span)
        else:
            roots.append(span)
    out: list[tuple[int, SpanRecord]] = []
    stack = [(0, s) for s in sorted(roots, key=lambda s: s.start_ns, reverse=True)]
    seen: set[str] = set()
    while stack:
        depth, span = stack.pop()
        if span.span_id in seen:
            continue
        seen.add(span.span_id)
        out.append((depth, span))
        kids = sorted(children.get(span.span_id, []), key=lambda s: s.start_ns, reverse=True)
        stack.extend((depth + 1, k) for k in kids)
    return out


def _label(span: SpanRecord, peers: dict[str, str]) -> str:
    attrs = span.attributes
    status = attrs.get("http.response.status_code") or attrs.get("http.status_code")
    host = attrs.get("server.address") or attrs.get("net.peer.name")
    port = attrs.get("server.port") or attrs.get("net.peer.port")
    origin = attrs.get("peer", "").split("://", 1)[-1]
    peer = None
    if span.kind == CLIENT:  # a server span's address is its own
        peer = peers.get(f"{host}:{port}") if host and port else peers.get(origin) if origin else None
    label = span.name + (f" {peer}" if peer else "") + (f" → {status}" if status else "")
    return label + (" [error]" if span.status == 2 else "")


def peer_names(root: Path) -> dict[str, str]:
    """`host:port` → the name of the stack's process listening there (from `stack.json`), so an
    outgoing HTTP span says whom it called (ds-connector, rec-registry, oidc, a service)."""
    try:
        info = json.loads((root / "stack.json").read_text())
    except (OSError, ValueError):
        return {}
    names: dict[str, str] = {}
    for name, url in (info.get("urls") or {}).items():
        names[str(url).split("://", 1)[-1].rstrip("/")] = name
    for name, urls in (info.get("replicas") or {}).items():
        for i, url in enumerate(urls):
            names[str(url).split("://", 1)[-1].rstrip("/")] = name if i == 0 else f"{name}-{i + 1}"
    return names


def draw_trace(trace: list[SpanRecord], width: int = 48, peers: dict[str, str] | None = None) -> list[str]:
    """One trace as lines: a heading, then per span its service, its place in the call tree, a bar
    on the trace's time axis and its duration."""
    start = min(s.start_ns for s in trace)
    end = max(max(s.end_ns, s.start_ns) for s in trace)
    total = max(end - start, 1)
    services = sorted({_SHORT.get(s.service_name, s.service_name) for s in trace})
    heading = f"trace {trace[0].trace_id}  {total / 1e6:.1f} ms  {len(trace)} spans"
    lines = [f"{heading}  services: {', '.join(services)}"]
    rows = call_tree(trace)
    labels = {s.span_id: _label(s, peers or {}) for s in trace}
    name_width = min(max(len("  " * d + labels[s.span_id]) for d, s in rows), 58)
    for depth, span in rows:
        first = int((span.start_ns - start) * width / total)
        last = max(int((max(span.end_ns, span.start_ns) - start) * width / total), first + 1)
        bar = " " * first + "█" * (min(last, width) - first)
        name = ("  " * depth + labels[span.span_id])[:name_width]
        service = _SHORT.get(span.service_name, span.service_name)
        kind = _KINDS.get(span.kind, "")
        duration = (span.end_ns - span.start_ns) / 1e6
        lines.append(f"  {service:<10} {name:<{name_width}} {kind:<8} |{bar:<{width}}| {duration:8.2f} ms")
    return lines


def render(
    spans: list[SpanRecord],
    count: int = 5,
    trace_id: str | None = None,
    width: int = 48,
    peers: dict[str, str] | None = None,
) -> str:
    if trace_id is not None:
        traces = [[s for s in spans if s.trace_id == trace_id]]
        traces = [t for t in traces if t]
    else:
        traces = last_traces(spans, count)
    if not traces:
        return "no spans received yet (make a request, then wait a second: services export every 0.5 s)"
    out: list[str] = []
    for trace in traces:
        out.extend(draw_trace(trace, width, peers))
        out.append("")
    return "\n".join(out).rstrip("\n")


def main(root: Path, count: int, trace_id: str | None, width: int) -> int:
    path = root / TRACES_FILE
    if not store_files(path):
        print(f"no span store at {path}: is the local stack running (`dataplane-local up`)?")
        return 2
    print(render(load_spans(path), count, trace_id, width, peer_names(root)))
    return 0
