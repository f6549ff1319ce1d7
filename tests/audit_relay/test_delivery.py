"""RF-10 delivery: every disclosure reaches its provider's connector, DID-only, at least once."""

from __future__ import annotations

import asyncio
from collections import Counter

from dataplane_contracts.ds import AuditQueryBody
from dataplane_testing import audit_relay as h


def _expected_body(ev: dict[str, object]) -> dict[str, object]:
    body = {k: ev[k] for k in ("dataset_id", "consumer_id", "agreement_id", "transfer_id", "row_count")}
    body |= {"user_id": None, "subject_id": None, "authorized_subject_ids": ev["authorized_subject_ids"]}
    if ev.get("decision_ref") is not None:
        body["decision_ref"] = ev["decision_ref"]
    return body


async def test_rf10_thousand_events_each_delivered_once_to_its_connector(harness: h.Harness) -> None:
    events = [
        h.event(
            h.PROVIDER_A if i % 2 == 0 else h.PROVIDER_B,
            row_count=i,
            authorized_subject_ids=[None, [], [f"did:web:s{i}.example"]][i % 3],
            decision_ref=None if i % 5 == 0 else "cd" * 32,
        )
        for i in range(1000)
    ]
    tokens_before = harness.issuer.token_requests
    delivered_before = h.sample(await asyncio.to_thread(harness.relay.metrics), "audit_relay_delivered_total")
    sends = [
        await harness.producer.send(harness.topic, h.json_bytes(ev), key=ev["provider_participant"].encode())
        for ev in events
    ]
    partitions = {(await s).partition for s in sends}
    assert len(partitions) == 2  # two providers, two partitions

    await harness.wait_accepted(events, timeout=120)
    for connector in (harness.a, harness.b):
        mine = [ev for ev in events if ev["provider_participant"] == connector.provider]
        calls = connector.audit_calls(ev["event_id"] for ev in events)
        # only this provider's events reached this connector, each exactly once (no fault injected)
        assert Counter(c.headers["idempotency-key"] for c in calls) == Counter(ev["event_id"] for ev in mine)
        by_id = {c.headers["idempotency-key"]: c for c in calls}
        for ev in mine:
            call = by_id[ev["event_id"]]
            assert call.status == 200
            assert call.body == _expected_body(ev)
            AuditQueryBody.model_validate(call.body)
            assert call.headers["authorization"].startswith("Bearer ")
        # order within the partition: the publish order, up to the relay's window — several
        # posts are in flight at once, so ds may see an event before one a few places earlier,
        # but never before one `window` or more places earlier was accepted (window.py)
        h.assert_bounded_order(
            [c.headers["idempotency-key"] for c in calls],
            [ev["event_id"] for ev in mine],
            h.window_of(harness.relay.env),
        )
    # the service token is fetched once (if not yet held), not per event
    assert harness.issuer.token_requests - tokens_before <= 1
    # the delivered counter moved by exactly the events delivered
    expected = delivered_before + len(events)
    assert await h.wait_counter(harness.relay, "audit_relay_delivered_total", expected) == expected


async def test_rf10_body_keeps_null_and_empty_subjects_apart(harness: h.Harness) -> None:
    null_subjects = h.event(h.PROVIDER_A, authorized_subject_ids=None, decision_ref=None)
    no_subjects = h.event(h.PROVIDER_A, authorized_subject_ids=[])
    await harness.publish([null_subjects, no_subjects])
    await harness.wait_accepted([null_subjects, no_subjects])
    bodies = {c.headers["idempotency-key"]: c.body for c in harness.a.audit_calls()}
    first, second = bodies[null_subjects["event_id"]], bodies[no_subjects["event_id"]]
    assert first["authorized_subject_ids"] is None
    assert "decision_ref" not in first  # never sent as null
    assert second["authorized_subject_ids"] == []
    assert second["decision_ref"] == no_subjects["decision_ref"]


async def test_trace_context_travels_from_the_kafka_headers_to_ds(harness: h.Harness) -> None:
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    ev = h.event(h.PROVIDER_B)
    await harness.producer.send_and_wait(
        harness.topic,
        h.json_bytes(ev),
        key=ev["provider_participant"].encode(),
        headers=[("traceparent", f"00-{trace_id}-00f067aa0ba902b7-01".encode())],
    )
    await harness.wait_accepted([ev])
    (call,) = harness.b.audit_calls([ev["event_id"]])
    assert call.headers["traceparent"].split("-")[1] == trace_id
    # a new span of the same trace, not the producer's span passed through
    assert call.headers["traceparent"].split("-")[2] != "00f067aa0ba902b7"
