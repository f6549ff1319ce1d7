"""From a Kafka record to what ds receives, or to a dead letter with its reason.

Nothing here does I/O. The audit body is built from the event alone (docs/wire-contracts.md, RF-10)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from dataplane_contracts.ds import AuditQueryBody, is_did
from dataplane_contracts.events import (
    DeadLetterReason,
    DisclosureDeadLetter,
    DisclosureRecorded,
    dead_letter_id,
)


@dataclass(frozen=True)
class Rejected:
    """An event that must not be sent: why, and its id when one could be read."""

    reason: DeadLetterReason
    detail: str
    event_id: str | None


def _text(raw: bytes | None) -> str | None:
    return None if raw is None else raw.decode("utf-8", "backslashreplace")


def _readable_event_id(data: object) -> str | None:
    if isinstance(data, dict):
        value = data.get("event_id")
        if isinstance(value, str) and len(value) <= 64:
            return value
    return None


def parse_event(raw: bytes | None) -> DisclosureRecorded | Rejected:
    """The event, or why it is rejected. Error details name fields, never their values."""
    if raw is None:
        return Rejected("unparseable", "record has no value", None)
    try:
        data: Any = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return Rejected("unparseable", "record value is not JSON", None)
    event_id = _readable_event_id(data)
    try:
        event = DisclosureRecorded.model_validate(data)
    except ValidationError as exc:
        return _rejected(exc, data, event_id)
    # belt and braces: the contract type already checks, but a DID-only body is the point (RF-10)
    if event.authorized_subject_ids is not None and not all(is_did(s) for s in event.authorized_subject_ids):
        return Rejected("non_did_subject", "authorized_subject_ids holds a value that is not a DID", event_id)
    return event


def _rejected(exc: ValidationError, data: Any, event_id: str | None) -> Rejected:
    errors = exc.errors(include_input=False, include_url=False)
    fields = sorted({".".join(str(p) for p in e["loc"]) or "<root>" for e in errors})
    subjects = data.get("authorized_subject_ids") if isinstance(data, dict) else None
    only_subjects = all(e["loc"][:1] == ("authorized_subject_ids",) for e in errors)
    if only_subjects and isinstance(subjects, list) and not all(is_did(s) for s in subjects):
        return Rejected("non_did_subject", "authorized_subject_ids holds a value that is not a DID", event_id)
    return Rejected("unparseable", f"not a DisclosureRecorded: invalid {', '.join(fields)}", event_id)


def audit_body(event: DisclosureRecorded) -> dict[str, Any]:
    """`POST /internal/audit/query` body: null subjects stay null, [] stays [], decision_ref only
    when present; user_id and subject_id are always null (docs/wire-contracts.md)."""
    return AuditQueryBody(
        dataset_id=event.dataset_id,
        consumer_id=event.consumer_id,
        agreement_id=event.agreement_id,
        transfer_id=event.transfer_id,
        row_count=event.row_count,
        authorized_subject_ids=event.authorized_subject_ids,
        decision_ref=event.decision_ref,
    ).wire()


_NOT_A_DID = "<redacted: not a DID>"
_NOT_IN_CONTRACT = "<redacted: not a DisclosureRecorded field>"


def _redact(value: bytes | None) -> bytes | None:
    """What the replayable copy must not carry (RF-10, RF-08): a subject that is not a DID (an
    email, a username), and the value of any field the contract does not have (a publisher bug
    that sent `principals` or `keys` must not copy them onto the DLQ). Field names stay, so the
    letter still shows what was wrong. Unchanged records are kept byte for byte."""
    try:
        data = json.loads(value or b"")
    except (ValueError, UnicodeDecodeError):
        return value
    if not isinstance(data, dict):
        return value
    changed = False
    subjects = data.get("authorized_subject_ids")
    if isinstance(subjects, list) and not all(is_did(s) for s in subjects):
        data["authorized_subject_ids"] = [s if is_did(s) else _NOT_A_DID for s in subjects]
        changed = True
    elif subjects is not None and not isinstance(subjects, list):
        data["authorized_subject_ids"] = _NOT_A_DID
        changed = True
    for field in set(data) - set(DisclosureRecorded.model_fields):
        data[field] = _NOT_IN_CONTRACT
        changed = True
    return json.dumps(data).encode() if changed else value


def dead_letter(
    rejected: Rejected,
    *,
    topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes | None,
    ds_status: int | None = None,
) -> bytes:
    value = _redact(value)
    record = DisclosureDeadLetter(
        event_id=dead_letter_id(topic, partition, offset),
        occurred_at=datetime.now(UTC),
        reason=rejected.reason,
        detail=rejected.detail,
        source_event_id=rejected.event_id,
        source_topic=topic,
        source_partition=partition,
        source_offset=offset,
        key=_text(key),
        value=_text(value),
        ds_status=ds_status,
    )
    return record.model_dump_json().encode()
