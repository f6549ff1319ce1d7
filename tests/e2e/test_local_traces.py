"""`dataplane-local traces` against the real local stack: the services export to the stack's own
OTLP receiver, and the command draws the last requests as waterfalls across the four services —
signaling for a DPS start, the gateway and the relay for a pull and its disclosure, the gateway
and the resolver (over Kafka) for a lookup-handler miss."""

from __future__ import annotations

import uuid

import pytest

from dataplane_local.demo import Wire, control_plane_token, pull, start_pull_flow
from dataplane_testing.e2e import System, fresh_principals, local_cli, new_traceparent, rec_registry_verdict
from dataplane_testing.polling import eventually

pytestmark = pytest.mark.e2e


async def _traces_command(system: System, *args: str) -> str:
    rc, out = await local_cli(system.root, "traces", *args, timeout=60)
    assert rc == 0, out
    return out


async def _stored(system: System, trace_id: str, services: set[str]) -> None:
    """Wait until the receiver's store holds spans of each of these services in the trace (each
    service exports on its own schedule; the relay's span ends once ds accepted the disclosure)."""
    seen: set[str] = set()

    def stored() -> bool:
        nonlocal seen
        seen = {s.service_name for s in system.receiver.spans(trace_id=trace_id)}
        return seen >= services

    if await eventually(stored, 30, 0.2):
        return
    raise AssertionError(f"trace {trace_id} holds spans of {sorted(seen)}, expected {sorted(services)}")


async def test_traces_draws_the_last_requests_as_waterfalls_across_the_four_services(system: System) -> None:
    wire = Wire(system.http)
    cp = await control_plane_token(wire, system.info)
    start_trace, start_parent = new_traceparent()
    flow = await start_pull_flow(wire, system.info, cp, traceparent=start_parent)
    pull_trace, pull_parent = new_traceparent()
    pulled = await pull(wire, flow.endpoint, flow.token, transfer_id=flow.flow_id, traceparent=pull_parent)
    assert pulled.status_code == 200, pulled.text
    agreement = await system.add_agreement(rec_registry_verdict(*fresh_principals()))
    miss_trace, miss_parent = new_traceparent()
    transfer = f"tp-traces-{uuid.uuid4().hex[:8]}"
    missed = await system.edr_query(agreement, transfer_id=transfer, traceparent=miss_parent)
    assert missed.status_code == 200, missed.text
    await _stored(system, start_trace, {"signaling"})
    await _stored(system, pull_trace, {"query-gateway", "audit-relay"})
    await _stored(system, miss_trace, {"query-gateway", "filter-resolver", "audit-relay"})

    drawn = await _traces_command(system, "--last", "20", "--width", "30")
    blocks = {block.split()[1]: block for block in drawn.split("\n\n") if block.startswith("trace ")}
    assert {start_trace, pull_trace, miss_trace} <= blocks.keys(), drawn
    # each a waterfall: a heading naming the services, then one row per span with a bar on the
    # trace's time axis, the request's own server span first
    start, pulled_block, miss = blocks[start_trace], blocks[pull_trace], blocks[miss_trace]
    assert "services: signaling" in start.splitlines()[0]
    assert start.splitlines()[1].split()[:2] == ["signaling", "POST"]
    assert "/dps/v1/dataflows/start → 200" in start.splitlines()[1]
    assert "services: gateway, relay" in pulled_block.splitlines()[0]
    assert "POST /dps/public/query → 200" in pulled_block.splitlines()[1]
    assert "ds-connector" in pulled_block  # the outgoing calls name whom they called
    assert "services: gateway, relay, resolver" in miss.splitlines()[0]
    rows = miss.splitlines()[1:]
    assert [r.split()[0] for r in rows][:1] == ["gateway"]
    assert any(r.split()[0] == "resolver" and "row_filter.resolve" in r for r in rows)
    assert any(r.split()[0] == "relay" for r in rows)
    for row in rows:
        bar = row.split("|")[1]
        assert len(bar) == 30 and "█" in bar, row
    # one trace by its id
    only = await _traces_command(system, "--trace", miss_trace)
    assert only.startswith(f"trace {miss_trace}") and start_trace not in only
