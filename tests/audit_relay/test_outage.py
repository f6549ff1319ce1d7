"""A ds outage for one provider pauses only that provider's partition: its events wait (never
skipped, never lost, the oldest retried first, in order up to the relay's window) while the other
provider's keep flowing; readiness reports ds."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from dataplane_testing import audit_relay as h

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
    # none lost, none twice, and in publish order up to the relay's window (several posts are in
    # flight at once: ds may see an event before one a few places earlier, never before one
    # `window` or more places earlier was accepted)
    window = h.window_of(harness.relay.env)
    by_partition: dict[int, list[dict[str, object]]] = {}
    for ev in a_events + b_events:  # each provider's events in publish order
        by_partition.setdefault(partition_of[ev["event_id"]], []).append(ev)
    assert len(by_partition) == 2
    for events in by_partition.values():
        ids = [str(ev["event_id"]) for ev in events]
        connector = harness.connector(str(events[0]["provider_participant"]))
        accepted = connector.accepted_ids(ids)
        assert sorted(accepted) == sorted(ids)
        h.assert_bounded_order(accepted, ids, window)
    # the partition that waited never skipped ahead: through the outage only its oldest event
    # was retried (the others of its first window were tried once, alongside it), and once ds
    # answered, that event was the first accepted
    assert harness.a.accepted_ids(a_ids)[0] == a_ids[0]
    a_calls = harness.a.audit_calls(a_ids)
    first_a_success = min(c.at for c in a_calls if c.status == 200)
    before_success = Counter(c.headers["idempotency-key"] for c in a_calls if c.at < first_a_success)
    assert before_success[a_ids[0]] >= 2
    assert all(n <= 1 for key, n in before_success.items() if key != a_ids[0])
    # B's events all landed before A's first success after the outage
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
