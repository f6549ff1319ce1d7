"""The catalogue's `records:` declaration and the frozen set's two ends (docs/records.md):
what signaling freezes from a declaration, and what the gateway accepts back from a grant."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from dataplane_contracts.catalogue import DatasetEntry
from dataplane_contracts.records import PROFILE_URI, FrozenSetInvalid, freeze, read_frozen

LAYERS = {
    "person": {"handler": "allow_all", "binds": "person"},
    "organization": {"handler": "allow_all", "binds": "organization"},
}


def entry(**over: Any) -> DatasetEntry:
    values: dict[str, Any] = {
        "id": "tx",
        "table": "tx",
        "row_filters": LAYERS,
        "columns": ["id", "amount", {"name": "secret", "mask": "hash"}],
        "records": {"key": ["id"], "range_filters": {"amount": {"type": "number", "ops": ["lte", "gte"]}}},
    }
    values.update(over)
    return DatasetEntry.model_validate(values)


def test_records_a_declaration_freezes_to_the_profiles_shape() -> None:
    assert freeze("tx", entry().records) == {
        PROFILE_URI: {"streams": {"tx": {"amount": {"type": "number", "ops": ["gte", "lte"]}}}}
    }
    assert freeze("tx", None) is None
    assert freeze("tx", entry(records={"key": ["id"]}).records) is None  # no filter: no member


@pytest.mark.parametrize(
    "records",
    [
        {"key": ["secret"]},  # masked
        {"key": ["hidden"]},  # not exposed
        {"key": ["id"], "range_filters": {"secret": {"type": "number", "ops": ["gte"]}}},
        {"key": ["id"], "range_filters": {"hidden": {"type": "number", "ops": ["gte"]}}},
        {"key": ["id"], "range_filters": {"amount": {"type": "string", "ops": ["gte"]}}},
        {"key": ["id"], "range_filters": {"amount": {"type": "number", "ops": ["eq"]}}},
        {"key": ["id"], "range_filters": {"amount": {"type": "number", "ops": []}}},
        {"key": ["id"], "range_filters": {"amount": {"type": "number", "ops": ["gte", "gte"]}}},
        {"key": ["id", "id"]},
        {"key": []},
        {"key": ["id"], "other": 1},
    ],
)
def test_records_a_declaration_outside_the_rules_is_refused(records: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        entry(records=records)


def test_records_the_frozen_set_read_back_ignores_unknown_members() -> None:
    member = {"streams": {"tx": {"amount": {"type": "number", "ops": ["gte"], "x": 1}}}, "y": 2}
    frozen = read_frozen({PROFILE_URI: member, "urn:other": None}, "tx")
    assert frozen is not None and frozen["amount"].ops == frozenset({"gte"})
    assert read_frozen(None, "tx") is None
    assert read_frozen("{}", "tx") is None  # no member of this profile: no frozen set


@pytest.mark.parametrize(
    "raw", ["not json", "null", "[]", json.dumps({PROFILE_URI: {"streams": {"tx": {"a": None}}}})]
)
def test_records_a_grant_that_is_not_an_extensions_object_is_malformed(raw: str) -> None:
    with pytest.raises(FrozenSetInvalid):
        read_frozen(raw, "tx")
