"""At least once across a crash: a relay killed with SIGKILL mid-stream and started again delivers
every event; an event delivered twice carries the same Idempotency-Key both times."""

from __future__ import annotations

import tempfile
import uuid
from collections import defaultdict
from pathlib import Path

import pytest

from dataplane_testing import audit_relay as h


@pytest.mark.slow
async def test_rf10_sigkill_mid_stream_then_restart_delivers_every_event(harness: h.Harness) -> None:
    # a relay of its own (own topic and group) in front of the same connector doubles
    suffix = uuid.uuid4().hex[:8]
    topic, dlq_topic = f"test.audit.kill.{suffix}", f"test.audit.kill.{suffix}.dlq"
    await h.make_topics(harness.bootstrap, topic, dlq_topic)
    urls = {h.PROVIDER_A: harness.a.server.url, h.PROVIDER_B: harness.b.server.url}
    env = h.relay_env(harness.bootstrap, topic, dlq_topic, f"relay-kill-{suffix}", harness.issuer, urls)
    # a narrow window and a slow ds (below), so the kill lands mid-stream: with connections kept
    # alive the default window delivered all 400 before the first check could see 60
    env["AUDIT_RELAY_MAX_IN_FLIGHT_PER_CONNECTOR"] = "4"
    log = Path(tempfile.mkdtemp(prefix="audit-relay-kill-")) / "relay.log"

    # every body is unique, so a call can be traced to its event without trusting the key it carries
    events = [
        h.event(h.PROVIDER_A if i % 2 else h.PROVIDER_B, dataset_id=f"ds-{suffix}-{i}", row_count=i)
        for i in range(400)
    ]
    for ev in events:
        await harness.producer.send_and_wait(topic, h.json_bytes(ev), key=ev["provider_participant"].encode())

    for c in (harness.a, harness.b):  # slow ds down a little so the kill lands mid-stream
        c.double.set_fault(endpoint="audit", status=None, delay_seconds=0.02)
    first = h.relay_process(dict(env), log)
    second = h.relay_process(dict(env), log)
    try:
        first.start()
        await h.wait_for(lambda: len(_accepted(harness, events)) >= 60, 60, "first deliveries")
        first.kill()
        assert len(_accepted(harness, events)) < len(events)  # it really died mid-stream
        second.start()
        await h.wait_for(lambda: len(_accepted(harness, events)) == len(events), 90, f"all delivered ({log})")
    finally:
        first.stop()
        second.stop()
        for c in (harness.a, harness.b):
            c.double.clear_faults()

    keys_by_event: dict[str, list[str]] = defaultdict(list)
    by_dataset = {ev["dataset_id"]: ev["event_id"] for ev in events}
    for c in (harness.a, harness.b):
        for call in c.double.calls("audit"):
            if isinstance(call.body, dict) and call.body.get("dataset_id") in by_dataset:
                keys_by_event[by_dataset[call.body["dataset_id"]]].append(call.headers["idempotency-key"])
    assert set(keys_by_event) == {ev["event_id"] for ev in events}
    for event_id, keys in keys_by_event.items():
        assert set(keys) == {event_id}  # a redelivery carries the same Idempotency-Key
    duplicates = sum(len(keys) - 1 for keys in keys_by_event.values())
    print(f"redelivered after the crash: {duplicates}")


def _accepted(harness: h.Harness, events: list[dict[str, object]]) -> set[str]:
    ids = [str(ev["event_id"]) for ev in events]
    return set(harness.a.accepted_ids(ids)) | set(harness.b.accepted_ids(ids))
