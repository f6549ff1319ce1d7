"""Writes `docs/asyncapi.yaml`, the AsyncAPI 3.0 document of the Kafka side, from the contracts:
one channel per topic of `dataplane_contracts.topics` (partitions, configuration), its message
with the record key, the W3C trace-context headers and the event's JSON Schema as pydantic
validates it, and who sends and who receives it.

    uv run python tools/asyncapi.py           # regenerate
    uv run python tools/asyncapi.py --check   # exit 1 when the committed file differs

A tool, not runtime: the contracts library stays shapes only."""

from __future__ import annotations

import argparse
import copy
import inspect
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from dataplane_contracts.dps import FlowStateChanged
from dataplane_contracts.events import (
    DisclosureDeadLetter,
    DisclosureRecorded,
    PlanRequest,
    PlanResolved,
)
from dataplane_contracts.topics import (
    AUDIT_DISCLOSURES,
    AUDIT_DISCLOSURES_DLQ,
    FLOW_EVENTS,
    PLAN_REPLIES,
    PLAN_REQUESTS,
    topic_specs,
)

OUTPUT = Path(__file__).resolve().parents[1] / "docs" / "asyncapi.yaml"
KAFKA_BINDING = "0.5.0"
_REF = "#/components/schemas/{model}"

TRACE_CONTEXT: dict[str, Any] = {
    "traceparent": {
        "type": "string",
        "pattern": "^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$",
        "description": "W3C trace context of the span that produced the record (absent when the "
        "producer traces nothing); consumers continue that trace",
    },
    "tracestate": {"type": "string", "description": "W3C trace state, when the trace carries one"},
}


@dataclass(frozen=True)
class Channel:
    """One topic: its event, its record key, who sends and who receives."""

    id: str
    topic: str
    event: type[BaseModel]
    summary: str
    key: dict[str, Any]
    senders: tuple[str, ...]
    receivers: tuple[str, ...]
    headers: tuple[tuple[str, dict[str, Any]], ...] = ()


CHANNELS = (
    Channel(
        "planRequests",
        PLAN_REQUESTS,
        PlanRequest,
        "A lookup row filter to resolve: the hashed cache key and a claim check in Redis, nothing "
        "else of the request (RF-07). Consumed by the filter-resolver's consumer group.",
        {"type": "string", "pattern": "^[0-9a-f]{64}$", "description": "the `cache_key`"},
        ("query-gateway",),
        ("filter-resolver",),
    ),
    Channel(
        "planReplies",
        PLAN_REPLIES,
        PlanResolved,
        "Where the resolved plan is (the shared Redis cache, or a one-shot key), or a typed error. "
        "Published to the `reply_partition` the request named; each gateway replica reads its own "
        "partition by manual assignment.",
        {"type": "string", "pattern": "^[0-9a-f]{32}$", "description": "the `correlation_id`"},
        ("filter-resolver",),
        ("query-gateway",),
    ),
    Channel(
        "auditDisclosures",
        AUDIT_DISCLOSURES,
        DisclosureRecorded,
        "One disclosed dataset of a served dataspace page, published (acks=all) before the page "
        "leaves the gateway; delivered to ds by subject DID only, at least once.",
        {
            "type": "string",
            "description": "the `provider_participant`; empty when null (the default connector)",
        },
        ("query-gateway",),
        ("audit-relay",),
    ),
    Channel(
        "auditDisclosuresDeadLetters",
        AUDIT_DISCLOSURES_DLQ,
        DisclosureDeadLetter,
        "A disclosure the relay cannot deliver, with why and the original record to replay.",
        {"type": "string", "description": "the dead-lettered record's own key"},
        ("audit-relay",),
        ("operators",),
        (
            (
                "dlq-reason",
                {
                    "type": "string",
                    "description": "the `reason`; the original record's headers precede it",
                },
            ),
        ),
    ),
    Channel(
        "flowEvents",
        FLOW_EVENTS,
        FlowStateChanged,
        "One committed data-flow transition, published from signaling's outbox (at least once: "
        "duplicates share `event_id`). A compacted topic: the last record per flow is its state.",
        {"type": "string", "description": "the `flow_id`"},
        ("signaling",),
        ("control planes and other subscribers",),
    ),
)


def _schemas() -> dict[str, Any]:
    _, top = models_json_schema(
        [(c.event, "validation") for c in CHANNELS], ref_template=_REF, title="dataplane events"
    )
    defs: dict[str, Any] = top["$defs"]
    return dict(sorted(defs.items()))


def _headers(channel: Channel) -> dict[str, Any]:
    # a copy per message: shared objects would be written as YAML anchors and aliases
    properties = copy.deepcopy({**TRACE_CONTEXT, **dict(channel.headers)})
    return {"type": "object", "properties": properties}


def _summary(doc: str) -> str:
    """A docstring's first paragraph on one line. Python 3.13 strips a docstring's indentation when
    compiling it and 3.11 keeps it, so the text is cleaned and its whitespace collapsed: the same
    document on every supported Python."""
    return " ".join(inspect.cleandoc(doc).split("\n\n")[0].split())


def _operation_id(action: str, channel: Channel) -> str:
    return f"{action}{channel.event.__name__}"


def document() -> dict[str, Any]:
    specs = {s.name: s for s in topic_specs()}
    assert set(specs) == {c.topic for c in CHANNELS}, "every topic has exactly one channel"
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    messages: dict[str, Any] = {}
    for c in CHANNELS:
        spec = specs[c.topic]
        name = c.event.__name__
        channels[c.id] = {
            "address": c.topic,
            "title": c.topic,
            "description": c.summary,
            "messages": {name: {"$ref": f"#/components/messages/{name}"}},
            "bindings": {
                "kafka": {
                    "topic": c.topic,
                    "partitions": spec.partitions,
                    "bindingVersion": KAFKA_BINDING,
                }
            },
            "x-topic-configuration": dict(sorted(spec.config.items())),
        }
        messages[name] = {
            "name": name,
            "title": name,
            "summary": _summary(c.event.__doc__ or name),
            "contentType": "application/json",
            "headers": _headers(c),
            "payload": {"$ref": _REF.format(model=name)},
            "bindings": {"kafka": {"key": c.key, "bindingVersion": KAFKA_BINDING}},
        }
        for action, who in (("send", c.senders), ("receive", c.receivers)):
            operations[_operation_id(action, c)] = {
                "action": action,
                "channel": {"$ref": f"#/channels/{c.id}"},
                "summary": f"{', '.join(who)} {'publishes' if action == 'send' else 'consumes'} {c.topic}",
                "messages": [{"$ref": f"#/channels/{c.id}/messages/{name}"}],
            }
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "dataplane events",
            "version": metadata.version("dataplane-contracts"),
            "description": "The Kafka side of the data plane: every topic, its record key and "
            "headers, and the JSON Schema of its event (the `dataplane_contracts` models; unknown "
            "fields are refused, changes are additive). Generated by `tools/asyncapi.py`; do not "
            "edit by hand.",
        },
        "defaultContentType": "application/json",
        "channels": channels,
        "operations": operations,
        "components": {"messages": messages, "schemas": _schemas()},
    }


def render() -> str:
    return yaml.safe_dump(document(), sort_keys=False, allow_unicode=True, width=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the committed file differs")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not OUTPUT.exists() or OUTPUT.read_text() != text:
            print(f"{OUTPUT} is out of date: run `uv run python tools/asyncapi.py`", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
