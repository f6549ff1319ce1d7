"""Kafka events. None has a field that could carry a token, principal, key, username,
organization or handler argument (the models forbid unknown fields)."""

from __future__ import annotations

import uuid
from typing import Annotated, Literal

from pydantic import AwareDatetime, Field, StrictInt, StrictStr, model_validator

from dataplane_contracts.base import ContractModel, Event
from dataplane_contracts.ds import Did
from dataplane_contracts.errors import ErrorCode
from dataplane_contracts.plans import Plan

HexDigest = Annotated[StrictStr, Field(pattern=r"^[0-9a-f]{64}$")]
OpaqueId = Annotated[StrictStr, Field(pattern=r"^[0-9a-f]{32}$")]


class PlanRequest(Event):
    """gateway → resolver: the hashed cache key and a claim-check id, nothing else of the request."""

    cache_key: HexDigest
    claim_check_id: OpaqueId
    correlation_id: OpaqueId
    reply_topic: StrictStr
    reply_partition: StrictInt | None = None
    deadline: AwareDatetime
    # The asker's Redis channel for an early copy of the reply; the Kafka reply is still
    # published and stays the one that is never lost (docs/row-filters.md, "The reply channel").
    reply_channel: Annotated[StrictStr, Field(pattern=r"^dataplane:plan-replies:[0-9a-f]{32}$")] | None = None


PlanOutcome = Literal["cached", "one_shot", "error"]


class PlanResolved(Event):
    """resolver → gateway: where the plan is, or a typed error."""

    correlation_id: OpaqueId
    cache_key: HexDigest
    outcome: PlanOutcome
    one_shot_id: OpaqueId | None = None
    error_code: ErrorCode | None = None
    error_detail: StrictStr | None = None

    @model_validator(mode="after")
    def _shape(self) -> PlanResolved:
        if (self.outcome == "one_shot") != (self.one_shot_id is not None):
            raise ValueError("one_shot_id is set exactly for a one-shot outcome")
        if (self.outcome == "error") != (self.error_code is not None):
            raise ValueError("error_code is set exactly for an error outcome")
        return self


class PlanReplyCopy(ContractModel):
    """resolver → the asking gateway, over its Redis channel (not Kafka): the early copy of a
    reply. With a `cached` outcome it carries the plan just written and its TTL, so the asker
    need not read it back; the plan never travels on Kafka. docs/row-filters.md, "The reply
    channel"."""

    reply: PlanResolved
    plan: Plan | None = None
    ttl_seconds: Annotated[StrictInt, Field(gt=0)] | None = None

    @model_validator(mode="after")
    def _shape(self) -> PlanReplyCopy:
        if (self.plan is not None) != (self.ttl_seconds is not None):
            raise ValueError("a plan travels with its TTL")
        if self.plan is not None and self.reply.outcome != "cached":
            raise ValueError("only a cached plan travels with its reply")
        return self


class DisclosureRecorded(Event):
    """gateway → audit-relay: one disclosed dataset. `authorized_subject_ids` is DIDs or null.

    `provider_participant` is null when the EDR token named no issuer: the default connector
    serves it, exactly as the gateway resolved it (docs/gateway.md, connector rule 3)."""

    provider_participant: StrictStr | None
    consumer_id: StrictStr
    agreement_id: StrictStr
    transfer_id: StrictStr | None = None
    dataset_id: StrictStr
    row_count: StrictInt
    decision_ref: StrictStr | None = None
    authorized_subject_ids: list[Did] | None


DeadLetterReason = Literal[
    "unparseable",  # not JSON, or not the DisclosureRecorded contract
    "non_did_subject",  # authorized_subject_ids holds something that is not a DID
    "unroutable",  # CONNECTOR_INTERNAL_URLS lists providers, but not this one
    "ds_not_configured",  # no connector for the provider and no default
    "ds_rejected",  # ds answered a 4xx that no retry can change
]


class DisclosureDeadLetter(Event):
    """audit-relay → operators, on `dataplane.audit.disclosures.dlq`: why a disclosure was not
    delivered, and the original record to replay. `detail` never quotes the value; a subject that
    is not a DID (possibly an email), and the value of a field the contract does not have, are
    redacted out of `value` before it is written.

    An event like the others: `occurred_at` is when it was dead-lettered. Its `event_id` is derived
    from the record's place (`dead_letter_id`), so the same record dead-lettered twice (a relay
    that crashed before committing) gives two copies with one id. `source_event_id` is the
    dead-lettered record's own id, when one could be read."""

    reason: DeadLetterReason
    detail: StrictStr
    source_event_id: StrictStr | None
    source_topic: StrictStr
    source_partition: StrictInt
    source_offset: StrictInt
    key: StrictStr | None
    # the record as published, for replay: out of the repr all the same, it is not ours to vouch for
    value: StrictStr | None = Field(repr=False)
    ds_status: StrictInt | None = None


_DEAD_LETTER_NAMESPACE = uuid.UUID("6f1c2a57-3b0e-4d8a-9c41-2e7d5b9f0a13")


def dead_letter_id(source_topic: str, source_partition: int, source_offset: int) -> uuid.UUID:
    """The dead letter's event id: one per source record, whoever writes it and however often."""
    return uuid.uuid5(_DEAD_LETTER_NAMESPACE, f"{source_topic}/{source_partition}/{source_offset}")
