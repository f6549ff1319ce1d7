"""Poison records go to the DLQ with their reason, are never sent, and do not block the partition."""

from __future__ import annotations

import asyncio
import json

from dataplane_contracts.events import DisclosureDeadLetter, DisclosureRecorded, dead_letter_id
from dataplane_testing import audit_relay as h


async def test_rf10_refused_unparseable_unroutable_and_non_did_go_to_dlq_and_later_events_flow(
    harness: h.Harness,
) -> None:
    before = await asyncio.to_thread(harness.relay.metrics)
    # all on provider A's key, so every poison record sits in front of a good one on one partition
    key = h.PROVIDER_A
    refused = h.event(h.PROVIDER_A)
    unroutable = h.event(h.UNROUTABLE)
    non_did = h.event(h.PROVIDER_A, authorized_subject_ids=["did:web:ok.example", "alice@example.org"])
    extra_field = h.event(h.PROVIDER_A) | {"principals": ["alice"]}
    after = [h.event(h.PROVIDER_A) for _ in range(4)]

    # ds refuses the next audit call with 400: that is the `refused` event, the relay being idle
    harness.a.double.set_fault(endpoint="audit", status=400, count=1)
    try:
        await harness.publish([refused], key=key)
        await harness.wait_dead_letters([refused["event_id"]])
    finally:
        harness.a.double.clear_faults()
    await harness.publish_raw(b"{not json", key)
    await harness.publish([unroutable, after[0], non_did, after[1], extra_field, after[2]], key=key)
    await harness.publish_raw(b'{"event_id": "e-1", "provider_participant": 7}', key)
    await harness.publish([after[3]], key=key)

    await harness.wait_accepted(after)
    ids = [refused["event_id"], unroutable["event_id"], non_did["event_id"], extra_field["event_id"], "e-1"]
    letters = await harness.wait_dead_letters(ids)
    assert letters[refused["event_id"]]["reason"] == "ds_rejected"
    assert letters[refused["event_id"]]["ds_status"] == 400
    assert letters[unroutable["event_id"]]["reason"] == "unroutable"
    assert letters[non_did["event_id"]]["reason"] == "non_did_subject"
    assert letters[extra_field["event_id"]]["reason"] == "unparseable"
    assert letters["e-1"]["reason"] == "unparseable"
    not_json = [d for d in harness.dlq if d["value"] == "{not json"]
    assert (
        len(not_json) == 1
        and not_json[0]["reason"] == "unparseable"
        and not_json[0]["source_event_id"] is None
    )

    for letter in [*letters.values(), *not_json]:
        # a dead letter is an event of its own, with an id derived from the record's place
        parsed = DisclosureDeadLetter.model_validate(letter)
        assert parsed.event_id == dead_letter_id(harness.topic, parsed.source_partition, parsed.source_offset)
        assert letter["key"] == key
        assert letter["source_topic"] == harness.topic
        assert isinstance(letter["source_offset"], int)
        # the detail names what is wrong, never the offending value (it may be personal data)
        assert "alice" not in letter["detail"]
    reasons = {hd.get("dlq-reason") for hd in harness.dlq_headers}
    assert {b"ds_rejected", b"unroutable", b"non_did_subject", b"unparseable"} <= reasons
    # the original record travels whole, so an operator can replay it
    assert DisclosureRecorded.model_validate_json(letters[unroutable["event_id"]]["value"]).event_id
    # the non-DID subject (an email) is redacted out of the replayable value; the DID stays
    redacted = json.loads(letters[non_did["event_id"]]["value"])
    assert redacted["authorized_subject_ids"] == ["did:web:ok.example", "<redacted: not a DID>"]
    assert "alice@example.org" not in letters[non_did["event_id"]]["value"]
    # nor does a field the contract does not have bring its value along
    extra = json.loads(letters[extra_field["event_id"]]["value"])
    assert extra["principals"] == "<redacted: not a DisclosureRecorded field>"

    # ds saw the refused event once (no retry of a 400) and never saw the others
    assert [c.status for c in harness.a.audit_calls([refused["event_id"]])] == [400]
    never = [unroutable["event_id"], non_did["event_id"], extra_field["event_id"], "e-1"]
    assert harness.a.audit_calls(never) == [] and harness.b.audit_calls(never) == []
    # delivered behind the poison records, each once, in order up to the relay's window
    after_ids = [ev["event_id"] for ev in after]
    accepted_after = harness.a.accepted_ids(after_ids)
    assert sorted(accepted_after) == sorted(after_ids)
    h.assert_bounded_order(accepted_after, after_ids, h.window_of(harness.relay.env))

    # each dead letter counted once under its reason; only the good events counted as delivered
    expected = {"ds_rejected": 1, "unroutable": 1, "non_did_subject": 1, "unparseable": 3}
    for reason, n in expected.items():
        at_least = h.sample(before, DEAD_LETTERED, reason=reason) + n
        assert await h.wait_counter(harness.relay, DEAD_LETTERED, at_least, reason=reason) == at_least
    delivered = h.sample(before, DELIVERED) + len(after)
    assert await h.wait_counter(harness.relay, DELIVERED, delivered) == delivered
    metrics = harness.relay.metrics()
    assert h.total(metrics, DEAD_LETTERED) - h.total(before, DEAD_LETTERED) == sum(expected.values())


DEAD_LETTERED = "audit_relay_dead_lettered_total"
DELIVERED = "audit_relay_delivered_total"
