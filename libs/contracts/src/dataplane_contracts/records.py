"""The records API's contracts (docs/records.md): a dataset's `records:` declaration in the
catalogue, and the client range-filter set frozen into a pull flow when it starts.

Signaling freezes (`freeze`) from the catalogue as it reads it at the start; the gateway reads the
frozen set back from the pull-grant view and checks it before serving (`read_frozen`), never
from its own catalogue: a later catalogue change neither adds nor removes a filter of a started
flow."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal, get_args

from pydantic import Field, StrictStr, field_validator, model_validator

from dataplane_contracts.base import ContractModel

PROFILE_URI = "https://pdpp.dev/profiles/client-range-filters/0.1-experimental"

RangeOp = Literal["gte", "gt", "lte", "lt"]
RangeType = Literal["integer", "number", "date", "date-time"]
RANGE_OPS: tuple[str, ...] = get_args(RangeOp)
RANGE_TYPES: tuple[str, ...] = get_args(RangeType)
# the start message's metadata member that asks for a frozen set (true; false or absent: none)
START_METADATA_KEY = "pdpp_range_filters"


def _distinct(values: list[Any], what: str) -> list[Any]:
    if len(set(values)) != len(values):
        raise ValueError(f"{what} lists a value more than once")
    return values


class RangeFilterSpec(ContractModel):
    """One declared range filter: its type and the operators offered on it."""

    type: RangeType
    ops: list[RangeOp] = Field(min_length=1)

    _ops_once = field_validator("ops")(lambda v: _distinct(v, "ops"))


class ChangesSpec(ContractModel):
    """A dataset's change order (docs/records.md, "Change sessions"): `column` holds the id of
    the transaction that last wrote the row (`xid8`, set by the operator's trigger), `deleted`
    the optional soft-delete column (a row is gone when it is true, or not NULL for a timestamp)."""

    column: StrictStr = Field(min_length=1, max_length=63)
    deleted: StrictStr | None = Field(default=None, min_length=1, max_length=63)


class RecordsSpec(ContractModel):
    """A dataset's `records:` declaration: the record key (unique columns, the order of every
    page and the position a cursor holds), the fields a flow may be granted range filters on,
    and the change order that `changes_since` sessions follow (None: no sessions)."""

    key: list[StrictStr] = Field(min_length=1)
    range_filters: dict[StrictStr, RangeFilterSpec] = Field(default_factory=dict)
    changes: ChangesSpec | None = None

    _key_once = field_validator("key")(lambda v: _distinct(v, "records.key"))

    @model_validator(mode="after")
    def _changes_apart(self) -> RecordsSpec:
        """The change and soft-delete columns are the gateway's bookkeeping: neither may be the
        record key, nor the two one column."""
        if self.changes is None:
            return self
        named = [self.changes.column, *([self.changes.deleted] if self.changes.deleted else [])]
        for name in named:
            if name in self.key:
                raise ValueError(f"records.changes column {name} is a records.key field")
        if len(set(named)) != len(named):
            raise ValueError("records.changes names one column as both column and deleted")
        return self


def freeze(dataset_id: str, records: RecordsSpec | None) -> dict[str, Any] | None:
    """The grant extensions member for a flow over `dataset_id`, from the declaration as it is
    now (the profile's shape, keyed by the profile URI); None when nothing is eligible — the
    member is then left out entirely."""
    if records is None or not records.range_filters:
        return None
    fields = {
        name: {"type": spec.type, "ops": [op for op in RANGE_OPS if op in spec.ops]}
        for name, spec in sorted(records.range_filters.items())
    }
    return {PROFILE_URI: {"streams": {dataset_id: fields}}}


@dataclass(frozen=True)
class FrozenField:
    type: str
    ops: frozenset[str]


class FrozenSetInvalid(ValueError):
    """The grant's frozen set is malformed: the grant is refused (403 grant_invalid), never
    repaired. The message names the rule, never a value."""


def _object(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict) or not value:
        raise FrozenSetInvalid(f"{what} must be a non-empty object")
    return value


def read_frozen(extensions: str | dict[str, Any] | None, dataset_id: str) -> dict[str, FrozenField] | None:
    """The flow's frozen set for its dataset, validated (docs/records.md, "The frozen set");
    None when the grant carries no member. Unknown members of the
    profile value and of a field descriptor are ignored. Raises FrozenSetInvalid."""
    if extensions is None:
        return None
    if isinstance(extensions, str):
        try:
            extensions = json.loads(extensions)
        except ValueError:
            raise FrozenSetInvalid("the grant extensions are not JSON") from None
    if not isinstance(extensions, dict):
        raise FrozenSetInvalid("the grant extensions must be an object")
    if PROFILE_URI not in extensions:
        return None
    member = extensions[PROFILE_URI]
    if not isinstance(member, dict):
        raise FrozenSetInvalid("the profile member must be an object")
    streams = _object(member.get("streams"), "streams")
    frozen: dict[str, FrozenField] = {}
    for stream, fields in streams.items():
        if stream != dataset_id:
            raise FrozenSetInvalid("a stream of the frozen set is not the flow's dataset")
        for name, descriptor in _object(fields, "a stream's field map").items():
            if not isinstance(name, str) or not name:
                raise FrozenSetInvalid("a field name must be a non-empty string")
            if not isinstance(descriptor, dict):
                raise FrozenSetInvalid("a field descriptor must be an object")
            kind, ops = descriptor.get("type"), descriptor.get("ops")
            if not isinstance(kind, str) or kind not in RANGE_TYPES:
                raise FrozenSetInvalid("a field's type is not one of the four")
            if not isinstance(ops, list) or not ops:
                raise FrozenSetInvalid("a field's ops must be a non-empty array")
            if any(not isinstance(op, str) or op not in RANGE_OPS for op in ops) or len(set(ops)) != len(ops):
                raise FrozenSetInvalid("a field's ops must be distinct operators of the four")
            frozen[name] = FrozenField(kind, frozenset(ops))
    return frozen
