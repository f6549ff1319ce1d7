"""Start-up checks of the catalogue's `records:` declarations against the datasets database
(GS-09's kind: the gateway refuses to start naming the dataset and the field)."""

from __future__ import annotations

from collections.abc import Mapping

import asyncpg

from dataplane_contracts.catalogue import Catalogue, DatasetEntry
from dataplane_contracts.records import ChangesSpec
from query_gateway.sql import CHANGE_INDEX, CHANGE_TYPE, DELETED_TYPES, CatalogueMismatch, ColumnTypes

# the column types a declared range-filter type is compared on exactly: numbers as PostgreSQL
# numeric (a float column is refused: its values are binary fractions), dates as dates, and
# date-times as instants (a timestamp without a zone names no instant)
FITTING: dict[str, frozenset[str]] = {
    "integer": frozenset({"smallint", "integer", "bigint"}),
    "number": frozenset({"smallint", "integer", "bigint", "numeric"}),
    "date": frozenset({"date"}),
    "date-time": frozenset({"timestamp with time zone"}),
}
# record-key column types a cursor holds as text and casts back exactly
KEY_TYPES = frozenset(
    {
        "smallint",
        "integer",
        "bigint",
        "numeric",
        "text",
        "character varying",
        "uuid",
        "date",
        "timestamp with time zone",
        "timestamp without time zone",
    }
)

_UNIQUE_SETS = """
SELECT array_agg(a.attname::text) AS cols
FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
WHERE i.indrelid = to_regclass($1) AND i.indisunique AND i.indpred IS NULL AND i.indexprs IS NULL
GROUP BY i.indexrelid
"""
_NOT_NULL = """
SELECT attname::text AS name FROM pg_attribute
WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped AND attnotnull
"""


def records_declared(catalogue: Catalogue) -> list[str]:
    return [d.id for d in catalogue.datasets if d.records is not None]


async def check_records(pool: asyncpg.Pool, catalogue: Catalogue, columns: ColumnTypes) -> None:
    """Every range-filter field a column of a fitting type; the record key columns of the table,
    NOT NULL, of a type a cursor can hold, and unique (a unique index without predicate or
    expression on some of them). Raises CatalogueMismatch."""
    async with pool.acquire() as conn:
        for entry in catalogue.datasets:
            records = entry.records
            if records is None:
                continue
            table = columns.get(entry.table, {})
            for name, spec in records.range_filters.items():
                pg_type = table.get(name)
                if pg_type is None:
                    raise CatalogueMismatch(
                        f"dataset {entry.id}: records.range_filters field {name}"
                        f" is not a column of {entry.table}"
                    )
                if pg_type not in FITTING[spec.type]:
                    raise CatalogueMismatch(
                        f"dataset {entry.id}: records.range_filters field {name} is declared {spec.type},"
                        f" but its column is {pg_type}"
                    )
            not_null = {r["name"] for r in await conn.fetch(_NOT_NULL, entry.table)}
            for name in records.key:
                pg_type = table.get(name)
                if pg_type is None:
                    raise CatalogueMismatch(
                        f"dataset {entry.id}: records.key field {name} is not a column of {entry.table}"
                    )
                if pg_type not in KEY_TYPES:
                    raise CatalogueMismatch(
                        f"dataset {entry.id}: records.key field {name} has type {pg_type},"
                        " which a cursor cannot hold"
                    )
                if name not in not_null:
                    raise CatalogueMismatch(f"dataset {entry.id}: records.key field {name} may be NULL")
            unique = [set(r["cols"]) for r in await conn.fetch(_UNIQUE_SETS, entry.table)]
            if not any(cols <= set(records.key) for cols in unique):
                raise CatalogueMismatch(
                    f"dataset {entry.id}: records.key {', '.join(records.key)} is not unique"
                    f" (no unique index of {entry.table} lies within it)"
                )
            if records.changes is not None:
                indexed = bool(await conn.fetchval(CHANGE_INDEX, entry.table, records.changes.column))
                _check_changes(entry, records.changes, table, not_null, indexed)


def _check_changes(
    entry: DatasetEntry, changes: ChangesSpec, table: Mapping[str, str], not_null: set[str], indexed: bool
) -> None:
    """The change column: an xid8 (the writing transaction's id, from the operator's trigger),
    NOT NULL, the first column of a plain btree index; the soft-delete column a boolean or a
    timestamp. docs/records.md, "Change sessions", gives the trigger and the index."""
    where = f"dataset {entry.id}: records.changes"
    column = changes.column
    pg_type = table.get(column)
    if pg_type is None:
        raise CatalogueMismatch(f"{where} column {column} is not a column of {entry.table}")
    if pg_type != CHANGE_TYPE:
        raise CatalogueMismatch(
            f"{where} column {column} has type {pg_type}; it must be xid8, set by a trigger"
            " to pg_current_xact_id()"
        )
    if column not in not_null:
        raise CatalogueMismatch(f"{where} column {column} may be NULL")
    if not indexed:
        raise CatalogueMismatch(
            f"{where} column {column} has no index that serves it (a btree index of {entry.table}"
            f" whose first column is {column}, without predicate)"
        )
    deleted = changes.deleted
    if deleted is not None and table.get(deleted) not in DELETED_TYPES:
        raise CatalogueMismatch(
            f"{where} deleted {deleted} is not a boolean or timestamp column of {entry.table}"
        )
