"""RF-10 as a property over generated events: whatever the gateway publishes, every body ds
receives names subjects only by DID (or null), and carries no field beyond the documented ones."""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dataplane_contracts.ds import is_did
from dataplane_testing import audit_relay as h

dids = st.from_regex(r"did:(web|key|example):[a-z0-9][a-z0-9.-]{0,20}", fullmatch=True)
not_dids = st.sampled_from(
    ["alice@example.org", "alice", "DID:web:x", "did:", "pod:meter-7", "", " did:web:x"]
)
subjects = st.one_of(
    st.none(),
    st.lists(dids, max_size=4),
    st.lists(st.one_of(dids, not_dids), min_size=1, max_size=4),
)
personal_fields = st.sampled_from(
    [{}, {}, {"principals": ["alice"]}, {"keys": ["pod:A"]}, {"user_id": "alice"}]
)


@st.composite
def events(draw: st.DrawFn) -> dict[str, Any]:
    ev = h.event(
        draw(st.sampled_from([h.PROVIDER_A, h.PROVIDER_B])),
        authorized_subject_ids=draw(subjects),
        decision_ref=draw(st.one_of(st.none(), st.from_regex(r"[0-9a-f]{64}", fullmatch=True))),
        transfer_id=draw(st.one_of(st.none(), st.text(min_size=1, max_size=10))),
        row_count=draw(st.integers(min_value=0, max_value=10**6)),
    )
    if draw(st.booleans()):
        del ev["decision_ref"]
    return ev | draw(personal_fields)


@settings(
    deadline=None,
    max_examples=20,
    derandomize=bool(os.environ.get("CI")),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(batch=st.lists(events(), min_size=1, max_size=5))
async def test_rf10_delivered_bodies_are_did_only_and_documented_fields_only(
    harness: h.Harness, batch: list[dict[str, Any]]
) -> None:
    await harness.publish(batch)
    sendable = [
        ev
        for ev in batch
        if set(ev) <= {*h.EVENT_FIELDS}
        and (ev["authorized_subject_ids"] is None or all(is_did(s) for s in ev["authorized_subject_ids"]))
    ]
    refused = [ev["event_id"] for ev in batch if ev not in sendable]
    await harness.wait_accepted(sendable)
    await harness.wait_dead_letters(refused)

    ids = [ev["event_id"] for ev in batch]
    calls = harness.a.audit_calls(ids) + harness.b.audit_calls(ids)
    assert sorted(c.headers["idempotency-key"] for c in calls) == sorted(ev["event_id"] for ev in sendable)
    for call in calls:
        body = call.body
        assert set(body) <= h.AUDIT_FIELDS
        subjects_sent = body["authorized_subject_ids"]
        assert subjects_sent is None or (
            isinstance(subjects_sent, list) and all(is_did(s) for s in subjects_sent)
        )
        assert body["user_id"] is None and body["subject_id"] is None
        assert "decision_ref" not in body or isinstance(body["decision_ref"], str)
