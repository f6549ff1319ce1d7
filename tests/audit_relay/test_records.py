"""Pure parts of the relay: event sorting, the audit body, the DLQ record, retry timing, settings."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from audit_relay.delivery import backoff_delay, parse_retry_after
from audit_relay.records import Rejected, audit_body, dead_letter, parse_event
from dataplane_contracts.events import DisclosureDeadLetter as DeadLetter
from dataplane_contracts.events import DisclosureRecorded
from dataplane_testing import audit_relay as h


def _raw(**overrides: object) -> bytes:
    return h.json_bytes(h.event(h.PROVIDER_A, **overrides))


def test_rf10_body_is_built_from_the_event_alone() -> None:
    ev = parse_event(_raw(authorized_subject_ids=["did:web:a.example"], decision_ref="ab" * 32))
    assert isinstance(ev, DisclosureRecorded)
    assert json.loads(audit_body(ev)) == {
        "dataset_id": "meter_readings",
        "consumer_id": "did:web:consumer.example",
        "user_id": None,
        "subject_id": None,
        "agreement_id": "agr-1",
        "transfer_id": "tp-1",
        "row_count": 3,
        "authorized_subject_ids": ["did:web:a.example"],
        "decision_ref": "ab" * 32,
    }


@pytest.mark.parametrize("subjects", [None, []])
def test_rf10_null_stays_null_and_empty_stays_empty(subjects: list[str] | None) -> None:
    ev = parse_event(_raw(authorized_subject_ids=subjects, decision_ref=None))
    assert isinstance(ev, DisclosureRecorded)
    body = json.loads(audit_body(ev))
    assert body["authorized_subject_ids"] == subjects
    assert "decision_ref" not in body


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (None, "unparseable"),
        (b"\xff\xfe", "unparseable"),
        (b"[1, 2]", "unparseable"),
        (_raw(row_count="3"), "unparseable"),
        (h.json_bytes(h.event() | {"principals": ["alice"]}), "unparseable"),
        (_raw(authorized_subject_ids=["alice@example.org"]), "non_did_subject"),
        (_raw(authorized_subject_ids=["did:web:a.example", "pod:meter-1"]), "non_did_subject"),
        (_raw(authorized_subject_ids=[42]), "non_did_subject"),
        (_raw(authorized_subject_ids="did:web:a.example"), "unparseable"),
    ],
)
def test_rf10_events_that_must_not_be_sent_are_rejected_with_a_reason(raw: bytes | None, reason: str) -> None:
    rejected = parse_event(raw)
    assert isinstance(rejected, Rejected)
    assert rejected.reason == reason
    assert "alice" not in rejected.detail and "meter-1" not in rejected.detail


def test_dead_letter_keeps_the_original_record_and_names_its_place() -> None:
    value = _raw(authorized_subject_ids=["alice@example.org"])
    rejected = parse_event(value)
    assert isinstance(rejected, Rejected)
    raw = dead_letter(rejected, topic="t", partition=2, offset=41, key=b"did:web:p", value=value)
    letter = DeadLetter.model_validate_json(raw)
    assert (letter.reason, letter.source_topic, letter.source_partition, letter.source_offset) == (
        "non_did_subject",
        "t",
        2,
        41,
    )
    assert letter.key == "did:web:p"
    assert letter.value is not None
    replay = json.loads(letter.value)
    # everything but the offending subject is kept for replay; the non-DID value is redacted
    assert replay == {**json.loads(value), "authorized_subject_ids": ["<redacted: not a DID>"]}
    assert "alice" not in raw.decode()
    assert letter.source_event_id == json.loads(value)["event_id"]
    # an event of its own: its id names the record's place, so writing it twice gives one id
    again = DeadLetter.model_validate_json(
        dead_letter(rejected, topic="t", partition=2, offset=41, key=b"did:web:p", value=value)
    )
    assert letter.event_id == again.event_id != uuid.UUID(json.loads(value)["event_id"])
    other = dead_letter(rejected, topic="t", partition=2, offset=42, key=b"did:web:p", value=value)
    assert DeadLetter.model_validate_json(other).event_id != letter.event_id
    assert letter.schema_version == 1 and letter.occurred_at.tzinfo is not None


def test_backoff_is_capped_jittered_and_honours_retry_after() -> None:
    rng = random.Random(7)
    delays = [backoff_delay(n, initial_s=0.5, max_s=8, rng=rng) for n in range(12)]
    assert all(0.25 <= d <= 8 for d in delays)
    assert all(4 <= d <= 8 for d in delays[5:])  # capped, with at most half of it random
    assert len(set(delays[5:])) > 1  # jittered
    assert backoff_delay(0, initial_s=0.5, max_s=8, retry_after_s=20, rng=rng) == 20
    assert (
        backoff_delay(0, initial_s=0.5, max_s=8, retry_after_s=10_000, retry_after_max_s=300, rng=rng) == 300
    )


def test_retry_after_seconds_and_http_date() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert parse_retry_after("7") == 7
    assert parse_retry_after(format_datetime(now + timedelta(seconds=30), usegmt=True), now=now) == 30
    assert parse_retry_after("soon") is None
    assert parse_retry_after(None) is None


def test_misconfigured_relay_refuses_to_start_naming_the_variable() -> None:
    env = {"PATH": "/usr/bin:/bin", "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1"}
    done = subprocess.run(
        [sys.executable, "-m", "audit_relay"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "CONNECTOR_INTERNAL_URL" in done.stderr


def test_rf10_dead_letter_value_keeps_no_personal_value_but_names_what_was_wrong() -> None:
    event = h.event(h.PROVIDER_A) | {"principals": ["alice@example.org"], "keys": ["pod:IT001"]}
    raw = h.json_bytes(event)
    rejected = parse_event(raw)
    assert isinstance(rejected, Rejected) and rejected.reason == "unparseable"
    letter = DeadLetter.model_validate_json(
        dead_letter(rejected, topic="t", partition=0, offset=1, key=None, value=raw)
    )
    assert letter.value is not None
    replay = json.loads(letter.value)
    assert replay["principals"] == replay["keys"] == "<redacted: not a DisclosureRecorded field>"
    personal = ("principals", "keys")
    # everything of the contract is kept for replay
    assert {k: v for k, v in replay.items() if k not in personal} == {
        k: v for k, v in event.items() if k not in personal
    }
    assert "alice@example.org" not in letter.value and "IT001" not in letter.value

    # subjects of the wrong shape are redacted whole
    raw = _raw(authorized_subject_ids="alice@example.org")
    rejected = parse_event(raw)
    assert isinstance(rejected, Rejected)
    letter = DeadLetter.model_validate_json(
        dead_letter(rejected, topic="t", partition=0, offset=2, key=None, value=raw)
    )
    assert letter.value is not None and "alice@example.org" not in letter.value

    # a record with nothing to redact travels byte for byte
    raw = _raw()
    letter = DeadLetter.model_validate_json(
        dead_letter(Rejected("unroutable", "x", None), topic="t", partition=0, offset=3, key=None, value=raw)
    )
    assert letter.value == raw.decode()
