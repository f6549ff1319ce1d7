"""Start-up checks of the catalogue's `records:` declarations against the datasets database
(GS-09's kind: the gateway refuses to start naming the dataset and the field)."""

from __future__ import annotations

import asyncpg

from dataplane_contracts.catalogue import Catalogue
from query_gateway.sql import CatalogueMismatch, ColumnTypes

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
