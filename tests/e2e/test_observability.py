"""Issue 7 across processes: one dataspace query with a lookup-handler cache miss is ONE trace
with spans from the gateway, the resolver and the relay (W3C context over HTTP and Kafka headers,
exported over OTLP to a receiver double); every running service serves its own metrics at
/metrics, none labelled with a principal, key, token or row value."""

from __future__ import annotations

import asyncio
import re
import time
import uuid

import pytest
from prometheus_client import CollectorRegistry

from dataplane_local.demo import DEMO_AGREEMENT, Wire, control_plane_token, start_pull_flow
from dataplane_local.doubles.otlp_receiver import SpanRecord
from dataplane_testing.e2e import (
    ALICE_USER_ID,
    System,
    fresh_principals,
    new_traceparent,
    rec_registry_verdict,
)

TRACED = {"query-gateway", "filter-resolver", "audit-relay"}
# What each service must contribute to the trace of that query, by instrumentation scope: incoming
# HTTP, SQL, Redis, outgoing HTTP and Kafka, each where the service does that work for the query.
SCOPES = {
    # every request's server span comes from the front door (`dataplane.server`)
    "query-gateway": {"dataplane.server", "httpx", "asyncpg", "redis", "aiokafka"},
    "filter-resolver": {"aiokafka", "redis", "httpx"},
    "audit-relay": {"aiokafka", "audit_relay"},  # its own client span of each post to ds
}

pytestmark = pytest.mark.e2e


async def test_one_dataspace_query_with_a_plan_miss_is_one_trace_across_three_services(
    system: System,
) -> None:
    agreement = await system.add_agreement(rec_registry_verdict(*fresh_principals()))
    trace_id, traceparent = new_traceparent()
    transfer = f"tp-trace-{uuid.uuid4().hex[:10]}"
    r = await system.edr_query(agreement, transfer_id=transfer, traceparent=traceparent)
    assert r.status_code == 200, r.text
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the relay's span ends once ds accepted the disclosure
        if transfer in await system.audit_transfer_ids():
            break
        await asyncio.sleep(0.2)
    services: set[str] = set()
    missing: dict[str, set[str]] = {}
    while time.monotonic() < deadline:  # the exporters flush every 200 ms
        spans = system.receiver.spans(trace_id=trace_id)
        services = {s.service_name for s in spans}
        missing = _missing_scopes(spans)
        if services >= TRACED and not missing:
            break
        await asyncio.sleep(0.2)
    spans = system.receiver.spans(trace_id=trace_id)
    seen = sorted({(s.service_name, s.scope, s.name) for s in spans})
    assert services >= TRACED, (
        f"trace {trace_id} misses spans of {sorted(TRACED - services)}; it holds {seen}; "
        f"traces of the same moment: {_traces_by_service(system)}"
    )
    assert not missing, f"trace {trace_id} lacks these kinds of span: {missing}; it holds {seen}"
    # one trace: every span of it hangs off another span of it, except the caller's parent
    ids = {s.span_id for s in spans}
    orphans = [s for s in spans if s.parent_span_id not in ids]
    assert {s.parent_span_id for s in orphans} == {traceparent.split("-")[2]}, seen


async def test_signaling_and_the_pull_are_traced_in_the_callers_trace(system: System) -> None:
    """The fourth service too: a DPS start joins the control plane's trace (HTTP and SQL spans)."""
    wire = Wire(system.http)
    cp = await control_plane_token(wire, system.info)
    trace_id, traceparent = new_traceparent()
    await start_pull_flow(wire, system.info, cp, traceparent=traceparent)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if system.receiver.spans(trace_id=trace_id, service="signaling"):
            break
        await asyncio.sleep(0.2)
    scopes: set[str] = set()
    while time.monotonic() < deadline:  # the SQL spans may arrive in a later export than the HTTP one
        scopes = {s.scope for s in system.receiver.spans(trace_id=trace_id, service="signaling")}
        if "dataplane.server" in scopes and any("asyncpg" in s for s in scopes):
            break
        await asyncio.sleep(0.2)
    # the server span comes from the front door (`dataplane.server`), as on every service
    assert "dataplane.server" in scopes and any("asyncpg" in s for s in scopes), (
        f"signaling's spans in the caller's trace come from {sorted(scopes)}; "
        f"traces: {_traces_by_service(system)}"
    )


def _missing_scopes(spans: list[SpanRecord]) -> dict[str, set[str]]:
    held: dict[str, set[str]] = {}
    for span in spans:
        held.setdefault(span.service_name, set()).add(span.scope)
    missing = {
        service: {kind for kind in kinds if not any(kind in scope for scope in held.get(service, ()))}
        for service, kinds in SCOPES.items()
    }
    return {service: kinds for service, kinds in missing.items() if kinds}


def _traces_by_service(system: System) -> dict[str, list[str]]:
    by: dict[str, set[str]] = {}
    for s in system.receiver.spans():
        by.setdefault(s.trace_id, set()).add(f"{s.service_name}:{s.name}")
    return {t: sorted(v) for t, v in list(by.items())[-8:]}


def _expected_metrics() -> dict[str, set[str]]:
    """Each service's metric names, read from its own metrics module."""
    from audit_relay import metrics as relay_metrics
    from filter_resolver import metrics as resolver_metrics
    from query_gateway import metrics as gateway_metrics
    from signaling import metrics as signaling_metrics

    def registry_names(registry: CollectorRegistry) -> set[str]:
        return {m.name for m in registry.collect()}

    return {
        "query-gateway": registry_names(gateway_metrics.Metrics().registry),
        "signaling": registry_names(signaling_metrics.Metrics().registry),
        "filter-resolver": registry_names(resolver_metrics.Metrics().registry),
        "audit-relay": registry_names(relay_metrics.Metrics().registry),
    }


_TYPE = re.compile(r"^# TYPE (\S+) ", re.MULTILINE)
_LABELS = re.compile(r'="((?:[^"\\]|\\.)*)"')


async def test_every_service_serves_its_metrics_without_personal_labels(system: System) -> None:
    # traffic first, so the labelled series exist: a pull, a lookup-handler miss and its delivery
    ok = await system.edr_query(DEMO_AGREEMENT, transfer_id=f"tp-metrics-{uuid.uuid4().hex[:8]}")
    assert ok.status_code == 200, ok.text
    agreement = await system.add_agreement(rec_registry_verdict(*fresh_principals()))
    assert (await system.edr_query(agreement)).status_code == 200
    expected = _expected_metrics()
    assert all(expected.values()), expected
    forbidden = [ALICE_USER_ID, "alice", "IT001E", "pod:", "did:web", "eyJ"]
    for instance, url in system.instance_urls().items():
        service = instance.removesuffix("-2")
        r = await system.http.get(f"{url}/metrics")
        assert r.status_code == 200, (instance, r.status_code)
        assert r.headers["content-type"].startswith("text/plain"), instance
        exposed = {n.removesuffix("_total") for n in _TYPE.findall(r.text)}
        wanted = {n.removesuffix("_total") for n in expected[service]}
        assert wanted <= exposed, f"{instance} lacks {sorted(wanted - exposed)}"
        label_values = _LABELS.findall(r.text)
        leaked = sorted({v for v in label_values for f in forbidden if f in v})
        assert not leaked, f"{instance} labels carry personal values: {leaked}"
