"""Retries on a timeout: a ds that hangs past the relay's HTTP timeout on the first attempts and
then answers gets every event, each attempt carrying the event's Idempotency-Key — with one post
per partition at a time (AUDIT_RELAY_MAX_IN_FLIGHT_PER_PARTITION=1) strictly in publish order,
the first event being the one retried; with the default window, the events whose posts hung."""

from __future__ import annotations

import tempfile
import uuid
from collections import Counter
from pathlib import Path

import pytest

from dataplane_testing import audit_relay as h

RELAY_TIMEOUT_S = 1.0
# far beyond the relay's timeout, so the first attempts cannot but time out
HANG_S = 10 * RELAY_TIMEOUT_S
HUNG_ATTEMPTS = 2


@pytest.mark.parametrize("window", ["1", "default"])
async def test_rf10_ds_hanging_past_the_timeout_is_retried_and_every_event_delivered(
    harness: h.Harness, window: str
) -> None:
    # a relay of its own, with a short timeout; the shared one keeps the default 5 s
    suffix = uuid.uuid4().hex[:8]
    topic, dlq_topic = f"test.audit.timeout.{suffix}", f"test.audit.timeout.{suffix}.dlq"
    await h.make_topics(harness.bootstrap, topic, dlq_topic)
    env = h.relay_env(
        harness.bootstrap,
        topic,
        dlq_topic,
        f"relay-timeout-{suffix}",
        harness.issuer,
        {h.PROVIDER_A: harness.a.server.url},
        AUDIT_RELAY_HTTP_TIMEOUT_S=str(RELAY_TIMEOUT_S),
    )
    if window != "default":
        env["AUDIT_RELAY_MAX_IN_FLIGHT_PER_PARTITION"] = window
    relay = h.relay_process(env, Path(tempfile.mkdtemp(prefix="audit-relay-timeout-")) / "relay.log")
    events = [h.event(h.PROVIDER_A, dataset_id=f"ds-{suffix}-{i}", row_count=i) for i in range(5)]
    ids = [ev["event_id"] for ev in events]

    # the next two audit calls hang, then answer normally (the relay has long given up on them:
    # ds took them, which is what the Idempotency-Key is for)
    harness.a.double.set_fault(endpoint="audit", status=None, delay_seconds=HANG_S, count=HUNG_ATTEMPTS)
    try:
        partitions = set()
        for ev in events:
            meta = await harness.producer.send_and_wait(topic, h.json_bytes(ev), key=h.PROVIDER_A.encode())
            partitions.add(meta.partition)
        assert len(partitions) == 1
        relay.start()
        await relay.wait_ready()
        delivered = await h.wait_counter(relay, "audit_relay_delivered_total", len(events))
        timeouts = h.sample(relay.metrics(), "audit_relay_retried_total", cause="timeout")
        metrics = relay.metrics()
    finally:
        relay.stop()
        harness.a.double.clear_faults()

    # every event accepted once as far as the relay knows, none lost, none dead-lettered
    assert delivered == len(events)
    assert timeouts >= HUNG_ATTEMPTS
    assert h.total(metrics, "audit_relay_retried_total") == timeouts  # nothing but the timeouts
    assert h.total(metrics, "audit_relay_dead_lettered_total") == 0
    assert harness.dead_letters(ids) == {}

    # the hung calls are recorded by the double only when they finally answer
    await h.wait_for(
        lambda: len(harness.a.audit_calls(ids)) == len(ids) + timeouts, 2 * HANG_S, "the hung calls to end"
    )
    calls = harness.a.audit_calls(ids)
    by_id = {ev["event_id"]: ev for ev in events}
    # every attempt, the abandoned ones included, carried its own event's Idempotency-Key
    for call in calls:
        assert call.body["dataset_id"] == by_id[call.headers["idempotency-key"]]["dataset_id"]
    answered = [c.headers["idempotency-key"] for c in calls]
    if window == "default":
        # all five went out at once: the hung posts were the first attempts of whichever events
        # reached ds first; each of those was retried, and every event was answered
        assert set(answered) == set(ids)
        assert sum(n - 1 for n in Counter(answered).values()) == timeouts
        return
    # one at a time: the first event was the one retried (the hung ones were its first attempts) ...
    assert answered.count(ids[0]) >= 1 + HUNG_ATTEMPTS
    # ... and the partition never skipped ahead of it: answered in publish order
    assert list(dict.fromkeys(answered)) == ids
