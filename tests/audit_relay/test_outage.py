"""A ds outage for one provider pauses only that provider's partition: its events wait (never
skipped, never lost, in order) while the other provider's keep flowing; readiness reports ds."""

from __future__ import annotations

import asyncio

import audit_relay_harness as h
import pytest

OUTAGE_S = 30.0


@pytest.mark.slow
async def test_rf10_503_for_30s_pauses_only_that_partition_and_loses_nothing(harness: h.Harness) -> None:
    harness.a.double.set_fault(endpoint="audit", status=503, seconds=OUTAGE_S)
    try:
        a_events = [h.event(h.PROVIDER_A, row_count=i) for i in range(40)]
        b_events = [h.event(h.PROVIDER_B, row_count=i) for i in range(40)]
        a_parts = await harness.publish(a_events[:20])
        b_parts = await harness.publish(b_events[:20])
        assert set(a_parts) != set(b_parts) and len(set(a_parts)) == len(set(b_parts)) == 1

        await harness.wait_accepted(b_events[:20], timeout=OUTAGE_S / 2)
        # readiness names ds once the outage outlasts the grace (2 s here)
        await h.wait_for(lambda: _failing(harness, "ds"), OUTAGE_S / 2, "unready naming ds")
        # more for both while A is still down: B's keep arriving
        await harness.publish(a_events[20:])
        await harness.publish(b_events[20:])
        await harness.wait_accepted(b_events, timeout=OUTAGE_S / 2)
        assert harness.a.accepted_ids(ev["event_id"] for ev in a_events) == []
        assert any(c.status == 503 for c in harness.a.audit_calls(ev["event_id"] for ev in a_events))

        await harness.wait_accepted(a_events, timeout=OUTAGE_S * 2)
    finally:
        harness.a.double.clear_faults()

    a_ids = [ev["event_id"] for ev in a_events]
    # none lost, none twice, in publish order
    assert harness.a.accepted_ids(a_ids) == a_ids
    # never skipped ahead: the attempts, repeats collapsed, are the publish order
    attempts = [c.headers["idempotency-key"] for c in harness.a.audit_calls(a_ids)]
    collapsed = [x for i, x in enumerate(attempts) if i == 0 or attempts[i - 1] != x]
    assert collapsed == a_ids
    # B's events all landed before A's first success after the outage
    first_a_success = min(c.at for c in harness.a.audit_calls(a_ids) if c.status == 200)
    assert all(c.at < first_a_success for c in harness.b.audit_calls(ev["event_id"] for ev in b_events))
    await harness.relay.wait_ready(10)

    metrics = harness.relay.metrics()
    assert 'audit_relay_retried_total{cause="http_503"}' in metrics
    assert "audit_relay_delivery_latency_seconds_bucket" in metrics
    assert f'audit_relay_consumer_lag{{partition="{a_parts[0]}",topic="{harness.topic}"}}' in metrics


async def _failing(harness: h.Harness, dependency: str) -> bool:
    r = await asyncio.to_thread(harness.relay.readyz)
    return r is not None and r.status_code == 503 and dependency in r.json()["failing"]
