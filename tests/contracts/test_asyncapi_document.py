"""Issue 14: `docs/asyncapi.yaml` is the AsyncAPI 3.0 document `tools/asyncapi.py` generates
from the contracts — every topic a channel with its key, trace headers and event schema — and
the committed file is what the generator writes now (a contract change without a regenerated
document fails here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from dataplane_contracts.dps import FlowStateChanged
from dataplane_contracts.events import DisclosureDeadLetter, DisclosureRecorded, PlanRequest, PlanResolved
from dataplane_contracts.topics import topic_specs
from dataplane_testing.scripts import load_script

ROOT = Path(__file__).parents[2]
tool = load_script("tools/asyncapi.py", "asyncapi_tool")


def committed() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "docs" / "asyncapi.yaml").read_text())
    return loaded


def test_the_committed_document_is_what_the_generator_writes() -> None:
    assert (ROOT / "docs" / "asyncapi.yaml").read_text() == tool.render(), (
        "docs/asyncapi.yaml is out of date: run `uv run python tools/asyncapi.py`"
    )
    assert tool.main(["--check"]) == 0


def test_every_topic_is_a_channel_with_its_partitions_key_and_trace_headers() -> None:
    doc = committed()
    assert doc["asyncapi"] == "3.0.0"
    channels = {c["address"]: c for c in doc["channels"].values()}
    assert set(channels) == {s.name for s in topic_specs()}
    for spec in topic_specs():
        channel = channels[spec.name]
        assert channel["bindings"]["kafka"]["partitions"] == spec.partitions
        assert channel["x-topic-configuration"] == spec.config
        [ref] = channel["messages"].values()
        message = doc["components"]["messages"][ref["$ref"].rsplit("/", 1)[1]]
        assert "traceparent" in message["headers"]["properties"]
        assert message["bindings"]["kafka"]["key"]["type"] == "string"
    for operation in doc["operations"].values():
        assert operation["action"] in ("send", "receive")
        assert operation["channel"]["$ref"].removeprefix("#/channels/") in doc["channels"]


def test_every_event_schema_is_the_contract_model_and_refuses_unknown_fields() -> None:
    schemas = committed()["components"]["schemas"]
    for model in (PlanRequest, PlanResolved, DisclosureRecorded, DisclosureDeadLetter, FlowStateChanged):
        schema = schemas[model.__name__]
        assert schema["additionalProperties"] is False
        assert set(schema["properties"]) == set(model.model_fields)
        assert {"event_id", "occurred_at", "schema_version"} <= set(schema["properties"])
    # every reference resolves inside the document
    text = (ROOT / "docs" / "asyncapi.yaml").read_text()
    for name in {
        line.split("/")[-1].strip("'\" ") for line in text.splitlines() if "#/components/schemas/" in line
    }:
        assert name in schemas, name
