"""The statements of a `changes_since` session (docs/records.md, "Change sessions"): the start-up
check that a declared change column has an index that serves it, and one session answer — the
narrowed statement's rows changed since the session's position, up to the horizon, in change
order, each with whether it is visible (else it is a tombstone) and the horizon beside them.

The horizon is `pg_snapshot_xmin(pg_current_snapshot())`, taken in the same statement (so the
same snapshot) as the rows: every transaction below it has ended, so no row a later commit
brings can carry a change id below it. A row written by a transaction still running, or by one
that committed after a transaction still running began, waits for a later answer instead of
being skipped for good."""

from __future__ import annotations

from dataclasses import dataclass

from query_gateway.sql.model import NarrowedQuery
from query_gateway.sql.scope import quoted as _ident

# the reserved prefix of the gateway's own output columns: no column of a dataset can be called so
HORIZON = "_dp_horizon"
CHANGE = "_dp_change"
VISIBLE = "_dp_visible"
KEY_PREFIX = "_dp_ckey"
# the statement's CTEs: the horizon, and the changed rows
HORIZON_CTE = "_dp_h"
ROWS_CTE = "_dp_c"
# the one read of the database's state beside the rows (pg_verify.py proves it is this, whole)
HORIZON_QUERY = "SELECT pg_snapshot_xmin(pg_current_snapshot()) AS x"

# an index that serves the change order: a plain btree whose first column is the change column
CHANGE_INDEX = """
SELECT count(*) FROM pg_index i
JOIN pg_class c ON c.oid = i.indexrelid
JOIN pg_am am ON am.oid = c.relam
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
WHERE i.indrelid = to_regclass($1) AND a.attname = $2 AND am.amname = 'btree'
  AND i.indpred IS NULL AND i.indexprs IS NULL
"""
CHANGE_TYPE = "xid8"
# soft-delete column types: a boolean is "deleted" when true, a timestamp when not NULL
DELETED_TYPES = frozenset({"boolean", "timestamp with time zone", "timestamp without time zone"})


@dataclass(frozen=True)
class RangeCondition:
    """One client filter as a comparison on the narrowed output: the value is bound as text and
    read by PostgreSQL into the compared type."""

    field: str
    sql_op: str
    text: str
    sql_type: str


@dataclass(frozen=True)
class ChangeOrder:
    table: str  # as the catalogue names it (already checked as an identifier)
    column: str
    deleted: str | None
    deleted_type: str | None
    key: tuple[str, ...]
    key_types: tuple[str, ...]


@dataclass(frozen=True)
class Position:
    """Where a session stands in change order. `key` None: every row whose change is below
    `change` was answered; else every row up to (`change`, `key`) was. `floor`: the horizon of
    the session's first answer (None before it): a row not visible whose change lies below it
    has not changed since the session began, so it was never delivered and needs no tombstone."""

    change: str  # an xid8 as text ("0": the beginning)
    key: tuple[str, ...] | None
    floor: str | None


@dataclass(frozen=True)
class ChangesRead:
    """The statement the executor runs for one session answer, and what it was built from: the
    verifier (pg_verify.py, `check_changes_statement`) builds the same wrapping around a constant
    and compares."""

    narrowed: NarrowedQuery  # the verified narrowed statement of the flow's dataset
    statement: NarrowedQuery
    order: ChangeOrder
    conditions: tuple[RangeCondition, ...]
    position: Position


def key_join(key: tuple[str, ...]) -> str:
    """The join of the narrowed rows `r` to the dataset's table `t` on the record key."""
    return " AND ".join(f"t.{_ident(k)} = r.{_ident(k)}" for k in key)


def _deleted(order: ChangeOrder) -> str:
    if order.deleted is None:
        return "FALSE"
    column = f"t.{_ident(order.deleted)}"
    return f"{column} IS TRUE" if order.deleted_type == "boolean" else f"{column} IS NOT NULL"


def changes_statement(
    narrowed: NarrowedQuery,
    order: ChangeOrder,
    conditions: tuple[RangeCondition, ...],
    position: Position,
    limit: int,
) -> ChangesRead:
    """At most `limit` rows of the narrowed statement after `position` and below the horizon,
    in (change, key) order. The change and soft-delete columns are read from the table joined on
    the record key (unique, checked at start-up) — only for rows the narrowed statement yields,
    so nothing is read of a row the flow may not see. A row not visible comes (as a tombstone)
    only when its change is at or above the session's floor — on the first answer, its own
    horizon: a beginning has nothing to take back."""
    params: list[object] = list(narrowed.params)

    def bind(value: object) -> str:
        params.append(value)
        return f"${len(params)}"

    visible = [f"NOT ({_deleted(order)})"]
    for c in conditions:
        visible.append(f"r.{_ident(c.field)} {c.sql_op} {bind(c.text)}::text::{c.sql_type}")
    # a NULL comparison (a NULL stored value) fails its filter: the row is not visible
    visible_sql = f"COALESCE({' AND '.join(visible)}, FALSE)"
    change = f"t.{_ident(order.column)}"
    since = bind(position.change)
    if position.key is None:
        after = f"{change} >= {since}::text::xid8"
    else:
        keys = ", ".join(f"t.{_ident(k)}" for k in order.key)
        values = ", ".join(
            f"{bind(v)}::text::{pg_type}" for v, pg_type in zip(position.key, order.key_types, strict=True)
        )
        after = (
            f"({change} > {since}::text::xid8 OR ({change} = {since}::text::xid8 AND ({keys}) > ({values})))"
        )
    join = key_join(order.key)
    key_text = ", ".join(f"r.{_ident(k)}::text AS {KEY_PREFIX}{i}" for i, k in enumerate(order.key))
    in_order = ", ".join([change, *(f"t.{_ident(k)}" for k in order.key)])
    horizon_value = f"(SELECT x FROM {HORIZON_CTE})"  # noqa: S608 - the statement's own CTE
    where = f"{after} AND {change} < {horizon_value}"
    floor = horizon_value if position.floor is None else f"{bind(position.floor)}::text::xid8"
    where += f" AND ({visible_sql} OR {change} >= {floor})"
    # the CTEs' names carry the reserved prefix: the narrowed statement inside cannot mean them
    horizon = f"WITH {HORIZON_CTE} AS MATERIALIZED ({HORIZON_QUERY}), "
    outputs = f"{change}::text::numeric AS {CHANGE}, {visible_sql} AS {VISIBLE}, {key_text}"
    sql = (
        f"{horizon}{ROWS_CTE} AS (SELECT r.*, {outputs}"  # noqa: S608 - quoted identifiers, bound values
        f" FROM ({narrowed.sql}) AS r JOIN {order.table} AS t ON {join}"
        f" WHERE {where} ORDER BY {in_order} LIMIT {bind(limit)})"
        # the horizon comes back even when no row changed: one row with no change then
        f" SELECT {HORIZON_CTE}.x::text AS {HORIZON}, {ROWS_CTE}.*"
        f" FROM {HORIZON_CTE} LEFT JOIN {ROWS_CTE} ON TRUE"
    )
    key_order = ", ".join(f"q.{_ident(k)} ASC" for k in order.key)
    statement = NarrowedQuery(
        sql=sql,
        params=tuple(params),
        param_labels=(*narrowed.param_labels, *(f"filter {c.field}" for c in conditions), "position"),
        denied=narrowed.denied,
        # the statement's own order again, on its output (the record key is an exposed, unmasked
        # column, so the narrowed output carries it as the table holds it)
        order_by=f" ORDER BY q.{CHANGE} ASC NULLS LAST, {key_order}",
    )
    return ChangesRead(narrowed, statement, order, conditions, position)


def watch_statement(table: str, column: str) -> str:
    """A change watcher's one query per tick for a whole dataset: the highest change below the
    horizon. Every change that becomes servable lies above the last value seen (it was at or
    above the horizon then, and that value below it), so a session waiting past position `p`
    has something to read once this reaches `p`. Served by the change column's index."""
    c = f"t.{_ident(column)}"
    return f"SELECT max({c})::text FROM {table} AS t WHERE {c} < pg_snapshot_xmin(pg_current_snapshot())"  # noqa: S608
