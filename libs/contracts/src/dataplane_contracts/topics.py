"""Kafka topics: names, partition counts and configuration, in one place."""

from __future__ import annotations

from dataclasses import dataclass, field

PLAN_REQUESTS = "dataplane.plan.requests"
PLAN_REPLIES = "dataplane.plan.replies"
AUDIT_DISCLOSURES = "dataplane.audit.disclosures"
AUDIT_DISCLOSURES_DLQ = "dataplane.audit.disclosures.dlq"
FLOW_EVENTS = "dataplane.dps.flow-events"

DAY_MS = 24 * 3600 * 1000


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    config: dict[str, str] = field(default_factory=dict)


def topic_specs(partitions: dict[str, int] | None = None) -> list[TopicSpec]:
    """The topics with their default partitions; `partitions` overrides counts by topic name.

    plan.requests partitions bound the resolver replicas; plan.replies partitions are shared by
    gateway replicas reading by manual assignment; disclosures are keyed by provider."""
    counts = {
        PLAN_REQUESTS: 6,
        PLAN_REPLIES: 6,
        AUDIT_DISCLOSURES: 6,
        AUDIT_DISCLOSURES_DLQ: 1,
        FLOW_EVENTS: 3,
    }
    counts.update(partitions or {})
    return [
        TopicSpec(PLAN_REQUESTS, counts[PLAN_REQUESTS], {"retention.ms": str(DAY_MS)}),
        TopicSpec(PLAN_REPLIES, counts[PLAN_REPLIES], {"retention.ms": str(DAY_MS)}),
        TopicSpec(
            AUDIT_DISCLOSURES,
            counts[AUDIT_DISCLOSURES],
            {"retention.ms": str(7 * DAY_MS), "min.insync.replicas": "1"},
        ),
        TopicSpec(AUDIT_DISCLOSURES_DLQ, counts[AUDIT_DISCLOSURES_DLQ], {"retention.ms": str(30 * DAY_MS)}),
        TopicSpec(FLOW_EVENTS, counts[FLOW_EVENTS], {"cleanup.policy": "compact"}),
    ]
