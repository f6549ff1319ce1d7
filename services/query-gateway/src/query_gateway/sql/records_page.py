"""A records page's statement (docs/records.md), built here like every statement the gateway sends
and proven by pg_verify.py (`check_records_page`) before it runs.

The page reads the narrowed statement of the flow's dataset as the rows it may read: the client
filters and the cursor are further conditions on that statement's output only, so they can narrow
and never widen; every value is a bound parameter that PostgreSQL reads from text into the
compared type; the record key's text sits beside each row (for the next cursor), and the page
queries order by the record key."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from dataplane_service_kit.errors import ServiceError
from query_gateway.sql.model import NarrowedQuery
from query_gateway.sql.pagination import ascending
from query_gateway.sql.scope import quoted

# the record key's text columns: the reserved prefix, so no column of a dataset is called that
KEY_PREFIX = "_dp_key"
SOURCE_ALIAS = "r"  # the narrowed statement, as the page's conditions name it
OPERATORS = frozenset({"<", "<=", ">", ">="})


@dataclass(frozen=True)
class Condition:
    """One client filter: `column op value`, the value's text read by PostgreSQL as `pg_type`."""

    column: str
    op: str
    text: str
    pg_type: str
    label: str  # what `param_labels` says of it: the field and operator, never the value

    def __repr__(self) -> str:
        return f"Condition(column={self.column!r}, op={self.op!r}, <hidden>)"


@dataclass(frozen=True)
class RecordsPage:
    """The statement the executor runs for one records page, and what it was built from: the
    verifier builds the same wrapping around a constant and compares."""

    narrowed: NarrowedQuery  # the verified narrowed statement of the flow's dataset
    statement: NarrowedQuery  # the page's statement, its conditions' values bound after the narrowing's
    conditions: tuple[Condition, ...]
    key: tuple[tuple[str, str], ...]  # (column, PostgreSQL type) of the record key, in order
    after: bool  # a cursor's key continues the page

    @property
    def fenced_only(self) -> bool:
        """Conditions on the rows: a narrowing under them must carry its barrier (pg_verify.py)."""
        return bool(self.conditions) or self.after


def key_output(i: int) -> str:
    """The name of the record key's `i`th column as text, beside each row."""
    return f"{KEY_PREFIX}{i}"


def wrapped(
    sql: str,
    n_params: int,
    conditions: Sequence[Condition],
    key: Sequence[tuple[str, str]],
    after: bool,
) -> str:
    """The page's statement around `sql` (a statement of `n_params` parameters): its conditions
    numbered from `n_params + 1`, the cursor's key after them."""
    r = SOURCE_ALIAS
    n = n_params
    conds: list[str] = []
    for c in conditions:
        if c.op not in OPERATORS:
            raise ServiceError("sql_refused", "a records condition has an operator not allowed")
        n += 1
        conds.append(f"{r}.{quoted(c.column)} {c.op} ${n}::text::{c.pg_type}")
    if after:
        placeholders = []
        for _, pg_type in key:
            n += 1
            placeholders.append(f"${n}::text::{pg_type}")
        columns = ", ".join(f"{r}.{quoted(k)}" for k, _ in key)
        conds.append(f"({columns}) > ({', '.join(placeholders)})")
    key_text = ", ".join(f"{r}.{quoted(k)}::text AS {key_output(i)}" for i, (k, _) in enumerate(key))
    where = " AND ".join(conds) if conds else "TRUE"
    return f"SELECT {r}.*, {key_text} FROM ({sql}) AS {r} WHERE {where}"  # noqa: S608 - bound values


def records_statement(
    narrowed: NarrowedQuery,
    conditions: Sequence[Condition],
    key: Sequence[tuple[str, str]],
    after: Sequence[str] | None,
) -> RecordsPage:
    """The page over the narrowed statement: `after` is the cursor's record key as text (None on
    the first page), bound after the conditions' values."""
    if not key or (after is not None and len(after) != len(key)):
        raise ServiceError("sql_refused", "a records page needs its whole record key")
    params: list[object] = [*narrowed.params, *(c.text for c in conditions), *(after or ())]
    sql = wrapped(narrowed.sql, len(narrowed.params), conditions, key, after is not None)
    statement = dataclasses.replace(
        narrowed,
        sql=sql,
        params=tuple(params),
        param_labels=(
            *narrowed.param_labels,
            *(c.label for c in conditions),
            *((f"cursor {k}" for k, _ in key) if after is not None else ()),
        ),
        order_by=ascending([k for k, _ in key]),
    )
    return RecordsPage(narrowed, statement, tuple(conditions), tuple(key), after is not None)
