"""Golden samples of shapes not emitted as events: the DPS messages a control plane sends (DPS-03),
the catalogue file, and the Redis layout of a cached and of a one-shot plan (RF-07). An incoming
sample is pinned together with what this data plane reads from it (`*.read.json`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from pydantic import BaseModel

from dataplane_contracts.catalogue import load_catalogue
from dataplane_contracts.dps import DataFlowPrepareMessage, DataFlowStartMessage
from dataplane_contracts.plans import (
    ONE_SHOT_TTL_SECONDS,
    Plan,
    PlanKeyInputs,
    plan_cache_key,
    plan_ttl,
    redis_one_shot_key,
    redis_plan_key,
)

GOLDEN = Path(__file__).parent / "golden"


def _golden(name: str, actual: Any) -> Any:
    """Compare with (or, under UPDATE_GOLDEN=1, rewrite) a golden file; returns the golden."""
    path = GOLDEN / name
    actual = json.loads(json.dumps(actual))
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(json.dumps(actual, indent=2, sort_keys=True) + "\n")
    golden = json.loads(path.read_text())
    assert actual == golden
    return golden


def _read(model: type[BaseModel], name: str) -> Any:
    sample = json.loads((GOLDEN / f"{name}.json").read_text())
    parsed = model.model_validate(sample)
    return parsed, _golden(f"{name}.read.json", parsed.model_dump(mode="json", by_alias=True))


def test_dps03_golden_prepare_message_rc2_spelling() -> None:
    msg, read = _read(DataFlowPrepareMessage, "dps_prepare_message")
    # RC2 spellings: processId, transferType; a field of a later version is ignored, not refused
    assert (msg.flow_id, msg.transfer_type) == ("flow-1", "HttpData-PULL")
    assert msg.callback_address == "https://cp.consumer.example/signaling/callback"
    assert "aFieldOfALaterSpecVersion" not in json.dumps(read)


def test_dps03_golden_start_message_rc3_spelling_with_data_address() -> None:
    msg, read = _read(DataFlowStartMessage, "dps_start_message")
    # RC3 spellings: dataFlowId, profile; nulls read as empty; the address read by local name
    assert (msg.flow_id, msg.transfer_type) == ("flow-2", "HttpData-PULL")
    assert (msg.claims, msg.labels, msg.metadata, msg.callback_address) == ({}, [], {}, None)
    assert msg.data_address is not None and msg.data_address.property("expiresIn") == "300"
    assert read["dataAddress"]["endpointProperties"][0]["@type"] == "EndpointProperty"


def test_golden_catalogue_file_reads_to_exactly_itself() -> None:
    # a JSON document is a YAML document: the golden sample is a catalogue file the gateway loads
    path = GOLDEN / "catalogue.json"
    catalogue = load_catalogue(path)
    assert catalogue.model_dump(mode="json") == json.loads(path.read_text())
    entry = catalogue.by_id()["energy.meter_readings"]
    assert entry.row_filters.person is not None and entry.row_filters.person.binds == "person"


# ---- Redis layout (RF-07) ---------------------------------------------------------------------------

SECRET = b"golden-secret-0123456789"
NOW = 1_800_000_000.0
INPUTS = PlanKeyInputs(
    handler="rec_registry", table="public.meter_readings", caller="sub-1", principals=None, args={"c": 1}
)
CACHED = Plan.among("pod", ["IT001", "IT002"], key_type="pod", label="pod keys")
ONE_SHOT = Plan.deny("pod")
ONE_SHOT_ID = "0123456789abcdef0123456789abcdef"


def _cached_layout() -> dict[str, Any]:
    # ds said cache for 60 s: the plan lives that long under its RF-07 key
    return {
        "key": redis_plan_key(plan_cache_key(INPUTS, SECRET)),
        "value": json.loads(CACHED.model_dump_json()),
        "expire_seconds": plan_ttl(300, 60, None, NOW),
    }


def _one_shot_layout() -> dict[str, Any]:
    # a plan whose TTL is 0 (the token expires now) is not cached: it waits for its one reader
    assert plan_ttl(300, None, int(NOW), NOW) == 0
    return {
        "key": redis_one_shot_key(ONE_SHOT_ID),
        "value": json.loads(ONE_SHOT.model_dump_json()),
        "expire_seconds": ONE_SHOT_TTL_SECONDS,
    }


def test_rf07_golden_redis_layout_of_a_cached_plan() -> None:
    layout = _golden("redis_cached_plan.json", _cached_layout())
    assert layout["key"].startswith("dataplane:plan:") and len(layout["key"].rsplit(":", 1)[1]) == 64


def test_rf07_golden_redis_layout_of_a_one_shot_plan() -> None:
    layout = _golden("redis_one_shot_plan.json", _one_shot_layout())
    assert layout["key"] == f"dataplane:plan-once:{ONE_SHOT_ID}"


@pytest.mark.parametrize("name", ["cached", "one_shot"])
async def test_rf07_golden_redis_layouts_round_trip_through_a_real_server(redis_url: str, name: str) -> None:
    layout = json.loads(
        (GOLDEN / f"redis_{'cached_plan' if name == 'cached' else 'one_shot_plan'}.json").read_text()
    )
    plan = CACHED if name == "cached" else ONE_SHOT
    client = aioredis.from_url(redis_url)
    try:
        # written as the resolver writes it, read as the gateway reads it
        await client.set(layout["key"], json.dumps(layout["value"]), ex=layout["expire_seconds"])
        if name == "cached":
            assert Plan.model_validate_json(await client.get(layout["key"])) == plan
            assert 0 < await client.pttl(layout["key"]) <= layout["expire_seconds"] * 1000
        else:
            assert Plan.model_validate_json(await client.getdel(layout["key"])) == plan
            assert await client.get(layout["key"]) is None  # read once
    finally:
        await client.aclose()
