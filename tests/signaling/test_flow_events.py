"""Flow events: every committed transition reaches `dataplane.dps.flow-events` through the
outbox, keyed by flow id, with the request's trace context and never a token."""

from __future__ import annotations

import asyncio
from typing import Any

from opentelemetry import propagate
from opentelemetry.sdk.trace import TracerProvider

from dataplane_testing.signaling import (
    FLOWS,
    auth,
    consumer_address,
    events_for,
    new_id,
    read_flow_events,
    sql,
    start_message,
    token_of,
)


async def test_every_transition_reaches_the_flow_events_topic(signaling: Any, cp_token: Any) -> None:
    c, h = signaling.client, auth(cp_token())
    provider, consumer, other = new_id(), new_id(), new_id()
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("control-plane") as span:
        # the control plane's trace reaches signaling as a traceparent header, which the front
        # door's server span continues
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        r = await c.post(f"{FLOWS}/start", json=start_message(provider), headers={**h, **carrier})
        trace_id = format(span.get_span_context().trace_id, "032x")
    tokens = [token_of(r.json())]
    await c.post(f"{FLOWS}/{provider}/suspend", headers=h)
    tokens.append(token_of((await c.post(f"{FLOWS}/{provider}/resume", headers=h)).json()))
    await c.post(f"{FLOWS}/{provider}/completed", json={}, headers=h)
    await c.post(f"{FLOWS}/{provider}/terminate", headers=h)  # 409: no event
    await c.post(f"{FLOWS}/prepare", json=start_message(consumer), headers=h)
    await c.post(f"{FLOWS}/{consumer}/started", json={"dataAddress": consumer_address()}, headers=h)
    await c.post(f"{FLOWS}/{consumer}/terminate", headers=h)
    await c.post(f"{FLOWS}/{consumer}/terminate", headers=h)  # idempotent: no second event
    await c.post(f"{FLOWS}/start", json=start_message(other), headers=h)
    await c.post(f"{FLOWS}/start", json=start_message(other), headers=h)  # 409: no event

    expected = {
        provider: [
            ("start", None, "STARTED"),
            ("suspend", "STARTED", "SUSPENDED"),
            ("resume", "SUSPENDED", "STARTED"),
            ("completed", "STARTED", "COMPLETED"),
        ],
        consumer: [
            ("prepare", None, "PREPARED"),
            ("started", "PREPARED", "STARTED"),
            ("terminate", "STARTED", "TERMINATED"),
        ],
        other: [("start", None, "STARTED")],
    }

    def complete(records: list[dict[str, Any]]) -> bool:
        return all(len(events_for(records, f)) >= len(e) for f, e in expected.items())

    records = await read_flow_events(signaling.settings.kafka_bootstrap_servers, complete)
    for flow, transitions in expected.items():
        events = events_for(records, flow)
        assert [(e["signal"], e["previous_state"], e["state"]) for e in events] == transitions
        assert len({e["event_id"] for e in events}) == len(events)
    first = next(r for r in records if r["key"] == provider)
    assert first["value"]["agreement_id"] == "agreement-1" and first["value"]["role"] == "PROVIDER"
    assert trace_id in first["headers"]["traceparent"].decode()
    everything = str([r for r in records if r["key"] in expected])
    assert not any(t in everything for t in tokens)
    unsent = await sql(
        str(signaling.settings.database_url).replace("+asyncpg", ""),
        "SELECT count(*) AS n FROM dps_outbox WHERE sent_at IS NULL",
    )
    assert unsent[0]["n"] == 0


async def _wait_sent(db: str, flow: str) -> None:
    """Until the relay has marked the flow's outbox row sent (it published it first)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while loop.time() < deadline:
        rows = await sql(db, "SELECT sent_at FROM dps_outbox WHERE key = $1", flow)
        if rows and all(r["sent_at"] is not None for r in rows):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the outbox row of {flow} was never marked sent")


async def test_at_least_once_a_republished_row_keeps_its_event_id(signaling: Any, cp_token: Any) -> None:
    """The crash window between the broker's ack and the commit of `sent_at`: the row is on the
    topic but still unsent in the table, so the next relay pass publishes it again. The copies
    must be recognisable as one event by `event_id`."""
    db = str(signaling.settings.database_url).replace("+asyncpg", "")
    flow = new_id()
    r = await signaling.client.post(f"{FLOWS}/start", json=start_message(flow), headers=auth(cp_token()))
    assert r.status_code == 200
    await _wait_sent(db, flow)
    (row,) = await sql(db, "SELECT event_id FROM dps_outbox WHERE key = $1", flow)
    # what a process killed after the ack and before its commit leaves behind
    await sql(db, "UPDATE dps_outbox SET sent_at = NULL WHERE key = $1", flow)
    await _wait_sent(db, flow)

    records = await read_flow_events(
        signaling.settings.kafka_bootstrap_servers, lambda recs: len(events_for(recs, flow)) >= 2
    )
    copies = events_for(records, flow)
    assert len(copies) == 2
    assert copies[0] == copies[1]
    assert {c["event_id"] for c in copies} == {str(row["event_id"])}
    assert [c["state"] for c in copies] == ["STARTED", "STARTED"]
