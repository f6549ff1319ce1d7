"""The flow's frozen range filters as the gateway uses them: read from the grant only, checked
before anything is served (a malformed set is 403 grant_invalid, never repaired), and each
filter of a request matched against them before any current declaration is looked at."""

from __future__ import annotations

from dataplane_contracts.catalogue import DatasetEntry
from dataplane_contracts.records import RANGE_OPS, FrozenField, FrozenSetInvalid, read_frozen
from dataplane_service_kit.errors import ServiceError
from query_gateway.records.request import RecordsQuery, RequestRefused
from query_gateway.records.startup import FITTING
from query_gateway.records.values import Bound, bound
from query_gateway.sql import ColumnTypes, dataset_columns

Frozen = dict[str, FrozenField]

# one answer for every filter outside the frozen set, whatever the field is elsewhere: a column,
# declared today, exposed, or nothing at all (no oracle)
OUTSIDE = "a client filter names a field or operator outside this flow's frozen filter set"


def frozen_of(grant_extensions: str | None, dataset_id: str) -> Frozen | None:
    """A grant's frozen set for its dataset, or None; 403 grant_invalid when malformed."""
    try:
        return read_frozen(grant_extensions, dataset_id)
    except FrozenSetInvalid:
        raise ServiceError("grant_invalid", "the flow's frozen filter set is malformed") from None


def bounds_of(query: RecordsQuery, frozen: Frozen | None) -> tuple[Bound, ...]:
    """Each filter checked against the frozen set alone, then its value by the frozen type."""
    if query.filters and frozen is None:
        raise RequestRefused("this flow carries no client filter set")
    checked: list[Bound] = []
    for field, op, _ in query.filters:
        spec = (frozen or {}).get(field)
        if spec is None or op not in spec.ops:
            raise RequestRefused(OUTSIDE)
    for field, op, value in query.filters:
        checked.append(bound(field, op, (frozen or {})[field].type, value))
    return tuple(checked)


def check_evaluable(
    bounds: tuple[Bound, ...], frozen: Frozen, entry: DatasetEntry, columns: ColumnTypes
) -> None:
    """A filter the request uses must be evaluable now: an exposed, unmasked column of a type
    that fits its frozen type. Otherwise 403 grant_invalid — never dropped, relaxed or served
    unfiltered. A frozen filter the request does not use is not looked at."""
    exposed = dict(dataset_columns(entry, columns).columns)
    types = columns.get(entry.table, {})
    for b in bounds:
        if b.field not in exposed or exposed[b.field] is not None:
            raise ServiceError("grant_invalid", "a client filter of this flow cannot be evaluated now")
        if types.get(b.field) not in FITTING[frozen[b.field].type]:
            raise ServiceError("grant_invalid", "a client filter of this flow cannot be evaluated now")


def metadata_of(dataset_id: str, frozen: Frozen | None) -> dict[str, object]:
    """The stream metadata: exactly the frozen set, operators in a fixed order."""
    fields = frozen or {}
    return {
        "name": dataset_id,
        "query": {
            "range_filters": {
                f: [op for op in RANGE_OPS if op in spec.ops] for f, spec in sorted(fields.items())
            },
            "range_filter_types": {f: spec.type for f, spec in sorted(fields.items())},
        },
    }
