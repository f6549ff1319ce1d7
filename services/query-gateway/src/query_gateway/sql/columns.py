"""Column types read at start-up (GS-09) and conversion of allow-list values to them.

An allow-list is always bound as one array parameter cast to the filter column's type, so the
comparison is the column's own (and its index is usable). A value that does not convert is
dropped, like a malformed key: dropping narrows by one subject and can never widen."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from datetime import date, datetime
from decimal import Decimal, InvalidOperation

import asyncpg

from dataplane_contracts.catalogue import Catalogue
from query_gateway.sql.exposure import check_exposure
from query_gateway.sql.model import CatalogueMismatch, ColumnTypes

_INT_RE = re.compile(r"^[+-]?\d{1,20}$")
_INT_BOUNDS = {"smallint": 2**15, "integer": 2**31, "bigint": 2**63}
_TRUE = frozenset({"t", "true", "y", "yes", "on", "1"})
_FALSE = frozenset({"f", "false", "n", "no", "off", "0"})


def _to_int(bound: int) -> Callable[[object], object]:
    def conv(v: object) -> object:
        if isinstance(v, bool):
            return None
        if isinstance(v, str) and _INT_RE.fullmatch(v.strip()):
            v = int(v.strip())
        if isinstance(v, int) and -bound <= v < bound:
            return v
        return None

    return conv


def _to_text(v: object) -> object:
    if isinstance(v, bool):
        return None
    text = v if isinstance(v, str) else str(v) if isinstance(v, int | float) else None
    # PostgreSQL text cannot hold NUL; binding one would fail the whole statement
    return text if text is not None and "\x00" not in text else None


def _to_numeric(v: object) -> object:
    if isinstance(v, bool) or not isinstance(v, str | int | float):
        return None
    try:
        d = Decimal(str(v).strip())
    except InvalidOperation:
        return None
    return d if d.is_finite() else None


def _to_float(v: object) -> object:
    d = _to_numeric(v)
    return float(d) if isinstance(d, Decimal) else None


def _to_uuid(v: object) -> object:
    if not isinstance(v, str):
        return None
    try:
        return uuid.UUID(v.strip())
    except ValueError:
        return None


def _to_bool(v: object) -> object:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in _TRUE | _FALSE:
        return v.strip().lower() in _TRUE
    return None


def _to_date(v: object) -> object:
    if not isinstance(v, str):
        return None
    try:
        return date.fromisoformat(v.strip())
    except ValueError:
        return None


def _to_timestamp(aware: bool) -> Callable[[object], object]:
    def conv(v: object) -> object:
        if not isinstance(v, str):
            return None
        try:
            ts = datetime.fromisoformat(v.strip())
        except ValueError:
            return None
        return ts if (ts.tzinfo is not None) == aware else None

    return conv


# PostgreSQL type name (format_type without typmod) -> (cast type for the array, converter).
# The cast never carries a length: `character` alone is char(1) and would truncate a value into
# a match with another row.
CASTS: dict[str, tuple[str, Callable[[object], object]]] = {
    "smallint": ("smallint", _to_int(_INT_BOUNDS["smallint"])),
    "integer": ("integer", _to_int(_INT_BOUNDS["integer"])),
    "bigint": ("bigint", _to_int(_INT_BOUNDS["bigint"])),
    "numeric": ("numeric", _to_numeric),
    "real": ("real", _to_float),
    "double precision": ("double precision", _to_float),
    "text": ("text", _to_text),
    "character varying": ("varchar", _to_text),
    "character": ("bpchar", _to_text),
    "uuid": ("uuid", _to_uuid),
    "boolean": ("boolean", _to_bool),
    "date": ("date", _to_date),
    "timestamp without time zone": ("timestamp", _to_timestamp(aware=False)),
    "timestamp with time zone": ("timestamptz", _to_timestamp(aware=True)),
}


def cast_for(pg_type: str) -> tuple[str, bool]:
    """(array element type, whether the column is compared as is). Another type (an enum, inet…)
    is compared through its text form: stricter than its own equality, never wider."""
    known = CASTS.get(pg_type)
    return (known[0], True) if known else ("text", False)


def convert_values(values: tuple[object, ...], pg_type: str) -> list[object]:
    """Values converted to the column's Python type, in order, duplicates and failures dropped."""
    known = CASTS.get(pg_type)
    conv = known[1] if known else _to_text
    out: list[object] = []
    seen: set[object] = set()
    for raw in values:
        value = conv(raw)
        if value is not None and value not in seen:
            seen.add(value)
            out.append(value)
    return out


async def load_column_types(pool: asyncpg.Pool, catalogue: Catalogue) -> ColumnTypes:
    """Every catalogued table's columns and types; CatalogueMismatch names dataset, filter and
    column when a filter column is missing (GS-09), the dataset and column when its `columns:`
    list names one the table lacks, or the dataset and table when the table is missing."""
    result: dict[str, dict[str, str]] = {}
    async with pool.acquire() as conn:
        for entry in catalogue.datasets:
            if entry.table in result:
                columns = result[entry.table]
            else:
                try:
                    oid = await conn.fetchval("SELECT to_regclass($1)::oid", entry.table)
                except asyncpg.PostgresError:
                    oid = None
                if oid is None:
                    raise CatalogueMismatch(f"dataset {entry.id}: table {entry.table} does not exist")
                rows = await conn.fetch(
                    "SELECT attname, format_type(atttypid, NULL) AS type FROM pg_attribute"
                    " WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
                    oid,
                )
                columns = {r["attname"]: r["type"] for r in rows}
                result[entry.table] = columns
            check_exposure(entry, result)
            for layer in ("person", "organization"):
                spec = getattr(entry.row_filters, layer)
                if spec is None or spec.column is None:
                    continue
                if spec.column not in columns:
                    raise CatalogueMismatch(
                        f"dataset {entry.id}: row_filters.{layer} ({spec.handler}) column "
                        f"{spec.column} does not exist in table {entry.table}"
                    )
    return result
