"""`table_pointer`: the caller's own rows are named by a pointer table in the datasets database.

args: `column`, `pointer_table` (`table` or `schema.table`), `pointer_key_column`;
`pointer_subject_column` (`user_id`). The resolver reads the pointer table itself, over a
read-only connection, and returns the values; a delegated request is refused. Identifiers come
from the catalogue, so they are validated and quoted; the caller's subject is a bound parameter."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from dataplane_contracts.plans import ClaimCheck, Plan
from filter_resolver.errors import invalid, unavailable
from filter_resolver.handlers.base import (
    optional_str,
    person_caller,
    required_str,
    unique_in_order,
)

NAME = "table_pointer"
IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]{0,62}$")

PoolGetter = Callable[[], Awaitable[asyncpg.Pool | None]]


def quote_identifier(name: str, what: str) -> str:
    if not IDENTIFIER.fullmatch(name):
        raise invalid(f"{NAME}: argument '{what}' is not a plain SQL identifier")
    return '"' + name + '"'


def quote_table(name: str) -> str:
    parts = name.split(".")
    if not 1 <= len(parts) <= 2:
        raise invalid(f"{NAME}: argument 'pointer_table' must be 'table' or 'schema.table'")
    return ".".join(quote_identifier(p, "pointer_table") for p in parts)


class TablePointerHandler:
    name = NAME

    def __init__(self, pool: PoolGetter) -> None:
        self._pool = pool

    async def resolve(self, claim: ClaimCheck) -> Plan:
        args = claim.args
        column = required_str(NAME, args, "column")
        table = quote_table(required_str(NAME, args, "pointer_table"))
        key = quote_identifier(required_str(NAME, args, "pointer_key_column"), "pointer_key_column")
        subject_col = optional_str(NAME, args, "pointer_subject_column", "user_id")
        subject = quote_identifier(subject_col, "pointer_subject_column")
        caller = person_caller(NAME, claim)
        if not caller.sub:
            raise invalid(f"{NAME}: the caller has no subject")
        pool = await self._pool()
        if pool is None:
            raise unavailable(f"{NAME}: DATASETS_DATABASE_URL is not configured")
        sql = f"SELECT {key} FROM {table} WHERE {subject} = $1 AND {key} IS NOT NULL ORDER BY 1"  # noqa: S608 - identifiers validated and quoted above; the value is bound
        try:
            rows = await pool.fetch(sql, caller.sub)
        except (asyncpg.UndefinedTableError, asyncpg.UndefinedColumnError):
            raise invalid(f"{NAME}: the pointer table or one of its columns does not exist") from None
        except asyncpg.InsufficientPrivilegeError:
            raise unavailable(f"{NAME}: the pointer table is not readable") from None
        except asyncpg.DataError:
            raise invalid(f"{NAME}: the subject column does not hold text") from None
        values: list[Any] = [_scalar(r[0]) for r in rows]
        return Plan.among(column, unique_in_order(values))


def _scalar(value: Any) -> Any:
    # a plan holds str/int/float/bool; anything else (uuid, numeric, date) travels as its text
    if isinstance(value, str | int | float | bool):
        return value
    return str(value)
