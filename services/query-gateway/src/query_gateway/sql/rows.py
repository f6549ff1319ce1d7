"""Rows as JSON carries them: the page's items (QE-04), converted column by column."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any

import asyncpg
import orjson

# exact types a row value most often has, and what JSON carries for each: one dict look-up
# instead of the isinstance chain below (which still decides any other type, subclasses included)
_AS_IS: frozenset[type] = frozenset({type(None), bool, int, float, str})
_ISO: frozenset[type] = frozenset({dt.datetime, dt.date, dt.time})
_PLAIN = (bool, int, float, str)
_TEMPORAL = (dt.datetime, dt.date, dt.time)
_SEQUENCES = (list, tuple)
_BYTES = (bytes, bytearray, memoryview)
# a column whose first value has one of these types holds only that type or NULL (a PostgreSQL
# column has one type, and the driver maps each type to one Python type), so its values are
# JSON's already
_UNCHANGED: frozenset[type] = frozenset({bool, int, float, str})

Convert = Callable[[Sequence[Any]], list[object]]


def jsonable(value: object) -> object:
    """A row value as JSON can carry it (FastAPI's rules: integral Decimal → int, else float)."""
    kind = type(value)
    if kind in _AS_IS:
        return value
    if kind in _ISO:
        return value.isoformat()  # type: ignore[attr-defined]
    if value is None or isinstance(value, _PLAIN):
        return value
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() and value.is_finite() else float(value)
    if isinstance(value, _TEMPORAL):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, _SEQUENCES):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, _BYTES):
        return bytes(value).hex()
    return str(value)


def _temporal(values: Sequence[Any]) -> list[object]:
    """A column of dates, times or timestamps (or NULL) as ISO 8601 text, in one orjson round
    trip: its text is `isoformat()`'s (test_rows), at a tenth of the cost of a call per value.
    A time with a zone, which orjson does not write, takes `isoformat()` value by value."""
    try:
        converted: list[object] = orjson.loads(orjson.dumps(values))
    except orjson.JSONEncodeError:
        return [jsonable(v) for v in values]
    return converted


def _each(values: Sequence[Any]) -> list[object]:
    return [jsonable(v) for v in values]


def _converter(first: object) -> Convert | None:
    """How a column's values are converted, from its first row's value; None: unchanged."""
    kind = type(first)
    if kind in _UNCHANGED:
        return None
    if kind in _ISO:
        return _temporal
    return _each  # NULL first, or any other type: decided value by value


def page_items(rows: Sequence[asyncpg.Record], drop_last: bool = False) -> list[dict[str, object]]:
    """Each row as a dict of JSON values, the same as `jsonable` on every value; `drop_last`
    leaves out the last column. The conversion is chosen once per column and applied to the
    column whole, so a page of plain columns is built at the speed of `dict(zip(...))`."""
    if not rows:
        return []
    names = list(rows[0].keys())
    if drop_last:
        names.pop()  # zip below stops at the shorter of names and values
    converters = [_converter(rows[0][i]) for i in range(len(names))]
    if all(c is None for c in converters):
        return [dict(zip(names, r, strict=False)) for r in rows]
    columns: list[Sequence[Any]] = []
    columns.extend(zip(*rows, strict=True))
    del columns[len(names) :]
    for i, convert in enumerate(converters):
        if convert is not None:
            columns[i] = convert(columns[i])
    return [dict(zip(names, values, strict=True)) for values in zip(*columns, strict=True)]
