"""A ds outage for one provider pauses only that provider's partition: its events wait (never
skipped, never lost, in order) while the other provider's keep flowing; readiness reports ds."""

from __future__ import annotations

import asyncio

import audit_relay_harness as h
import pytest

OUTAGE_S = 30.0


@pytest.mark.slow
async def test_rf10_503_for_30s_pauses_only_that_partition_and_loses_nothing(harness: h.Harness) -> None:
    before = await asyncio.to_thread(harness.relay.metrics)
    harness.a.double.set_fault(endpoint="audit", status=503, seconds=OUTAGE_S)
    try:
        a_events = [h.event(h.PROVIDER_A, row_count=i) for i in range(40)]
        b_events = [h.event(h.PROVIDER_B, row_count=i) for i in range(40)]
        a_parts = await harness.publish(a_events[:20])
        b_parts = await harness.publish(b_events[:20])
        assert set(a_parts) != set(b_parts) and len(set(a_parts)) == len(set(b_parts)) == 1
        partition_of = {
            ev["event_id"]: p for ev, p in zip(a_events[:20] + b_events[:20], a_parts + b_parts, strict=True)
        }

        await harness.wait_accepted(b_events[:20], timeout=OUTAGE_S / 2)
        # readiness names ds once the outage outlasts the grace (2 s here)
        await h.wait_for(lambda: _failing(harness, "ds"), OUTAGE_S / 2, "unready naming ds")
        # more for both while A is still down: B's keep arriving
        for evs in (a_events[20:], b_events[20:]):
            for ev, p in zip(evs, await harness.publish(evs), strict=True):
                partition_of[ev["event_id"]] = p
        await harness.wait_accepted(b_events, timeout=OUTAGE_S / 2)
        assert harness.a.accepted_ids(ev["event_id"] for ev in a_events) == []
        assert any(c.status == 503 for c in harness.a.audit_calls(ev["event_id"] for ev in a_events))

        await harness.wait_accepted(a_events, timeout=OUTAGE_S * 2)
    finally:
        harness.a.double.clear_faults()

    a_ids = [ev["event_id"] for ev in a_events]
    # within every partition (the one that waited out the outage and the one that kept flowing):
    # none lost, none twice, in publish order, and never skipped ahead — the attempts, repeats
    # collapsed, are the publish order
    by_partition: dict[int, list[dict[str, object]]] = {}
    for ev in a_events + b_events:  # each provider's events in publish order
        by_partition.setdefault(partition_of[ev["event_id"]], []).append(ev)
    assert len(by_partition) == 2
    for events in by_partition.values():
        ids = [str(ev["event_id"]) for ev in events]
        connector = harness.connector(str(events[0]["provider_participant"]))
        assert connector.accepted_ids(ids) == ids
        attempts = [c.headers["idempotency-key"] for c in connector.audit_calls(ids)]
        collapsed = [x for i, x in enumerate(attempts) if i == 0 or attempts[i - 1] != x]
        assert collapsed == ids
    # B's events all landed before A's first success after the outage
    first_a_success = min(c.at for c in harness.a.audit_calls(a_ids) if c.status == 200)
    assert all(c.at < first_a_success for c in harness.b.audit_calls(ev["event_id"] for ev in b_events))
    await harness.relay.wait_ready(10)

    # each delivery counted once, and each 503 ds answered counted as one retry
    delivered_before = h.sample(before, "audit_relay_delivered_total")
    expected = delivered_before + len(a_events) + len(b_events)
    assert await h.wait_counter(harness.relay, "audit_relay_delivered_total", expected) == expected
    metrics = harness.relay.metrics()
    answered_503 = sum(c.status == 503 for c in harness.a.audit_calls(a_ids))
    retried_503 = h.sample(metrics, "audit_relay_retried_total", cause="http_503")
    assert retried_503 - h.sample(before, "audit_relay_retried_total", cause="http_503") == answered_503
    assert "audit_relay_delivery_latency_seconds_bucket" in metrics
    assert f'audit_relay_consumer_lag{{partition="{a_parts[0]}",topic="{harness.topic}"}}' in metrics


async def _failing(harness: h.Harness, dependency: str) -> bool:
    r = await asyncio.to_thread(harness.relay.readyz)
    return r is not None and r.status_code == 503 and dependency in r.json()["failing"]
