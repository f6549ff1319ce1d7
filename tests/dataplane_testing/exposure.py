# ruff: noqa: E501 - SQL test data reads best on one line
"""Column exposure's model (issue 15), shared by the SQL-pipeline tests
(query_gateway/sql/test_column_exposure.py) and the HTTP ones
(query_gateway/test_column_exposure_http.py): two datasets over `sqlgw`'s tables —
`narrow.readings` exposing 2 of the 4 columns of public.readings while its row filters read the
other two, and `masked.sites` masking two columns of energy."Sites" — database B holding only
the exposed columns of the permitted rows, and a statement per position a column can be reached
from, with `{c}` for the column it names."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
from collections.abc import AsyncIterator
from typing import Any

import asyncpg

from .databases import scratch_connection
from .sqlgw import SITES, Permit

MASK_KEY = "column-mask-key-for-tests-0123456789"

NARROW = "narrow.readings"
MASKED = "masked.sites"

DATASETS: list[dict[str, Any]] = [
    {
        "id": NARROW,
        "table": "public.readings",
        "access_level": "open",
        "expose": True,
        "dataspace_expose": True,
        # listed out of table order: the fence keeps the table's (id, value)
        "columns": ["value", "id"],
        "row_filters": {
            "person": {"handler": "subject_key_match", "args": {"column": "pod", "key_type": "pod"}},
            "organization": {"handler": "organization_match", "args": {"column": "org"}},
        },
    },
    {
        "id": MASKED,
        "table": 'energy."Sites"',
        "access_level": "open",
        "expose": True,
        "dataspace_expose": True,
        "columns": [
            "site_id",
            {"name": "site_uuid", "mask": "hash"},
            {"name": "pod", "mask": "null"},
            "name",
        ],
        "row_filters": {
            "person": {"handler": "allow_all", "binds": "person"},
            "organization": {"handler": "allow_all", "binds": "organization"},
        },
    },
]

EXPOSED = ("id", "value")  # narrow.readings' columns
HIDDEN = ("pod", "org", "nosuch", '"Value"')  # its filter columns, a column no table has, a case twin

# every place a column can be named from; each statement reads narrow.readings only
POSITIONS = {
    "select list": "SELECT {c} FROM narrow.readings",
    "select list, qualified": "SELECT r.{c} FROM narrow.readings r",
    "where": "SELECT r.id FROM narrow.readings r WHERE {c} IS NOT NULL",
    "where, qualified": "SELECT r.id FROM narrow.readings r WHERE r.{c} > 3",
    "join on": "SELECT a.id FROM narrow.readings a JOIN narrow.readings b ON a.id = b.id AND b.{c} > 3",
    "join using": "SELECT count(*) AS n FROM narrow.readings a JOIN narrow.readings b USING ({c})",
    "group by": "SELECT count(*) AS n FROM narrow.readings GROUP BY {c}",
    "having": "SELECT r.value, count(*) AS n FROM narrow.readings r GROUP BY r.value HAVING max(r.{c}) > 0",
    "order by": "SELECT r.id FROM narrow.readings r ORDER BY {c}, r.id",
    "distinct on": "SELECT DISTINCT ON ({c}) r.id FROM narrow.readings r ORDER BY {c}, r.id",
    "window partition": "SELECT r.id, row_number() OVER (PARTITION BY r.{c} ORDER BY r.id) AS rn FROM narrow.readings r",
    "window clause": "SELECT r.id, rank() OVER w AS rk FROM narrow.readings r WINDOW w AS (ORDER BY {c})",
    "function argument": "SELECT coalesce(r.{c}, 0) AS v, abs({c}) AS a FROM narrow.readings r",
    "aggregate filter": "SELECT count(*) FILTER (WHERE {c} > 3) AS n FROM narrow.readings",
    "case": "SELECT CASE WHEN {c} > 3 THEN 'big' ELSE 'small' END AS size FROM narrow.readings",
    "scalar subquery": "SELECT (SELECT max(x.{c}) FROM narrow.readings x) AS m FROM narrow.readings r WHERE r.id < 3",
    "in subquery": "SELECT r.id FROM narrow.readings r WHERE r.id IN (SELECT {c} FROM narrow.readings)",
    "correlated subquery": "SELECT r.id, (SELECT count(*) FROM narrow.readings x WHERE x.value = r.{c}) AS n FROM narrow.readings r",
    "derived table": "SELECT d.{c} FROM (SELECT * FROM narrow.readings) d",
    "derived table body": "SELECT d.k FROM (SELECT {c} AS k FROM narrow.readings) d",
    "lateral": "SELECT r.id, l.k FROM narrow.readings r, LATERAL (SELECT r.{c} AS k) l",
    "cte body": "WITH x AS (SELECT {c} AS k FROM narrow.readings) SELECT count(*) AS n, sum(x.k) AS s FROM x",
    "cte reference": "WITH x AS (SELECT * FROM narrow.readings) SELECT x.{c} FROM x",
    "cte column unqualified": "WITH x AS (SELECT r.* FROM narrow.readings r) SELECT {c} FROM x",
}

# every way to the whole row, all of which must show the exposed columns only
WHOLE = {
    "star": "SELECT * FROM narrow.readings",
    "qualified star": "SELECT r.* FROM narrow.readings r",
    "star over a join": "SELECT * FROM narrow.readings r JOIN (SELECT 1 AS one) o ON TRUE",
    "star of a derived table": "SELECT x.* FROM (SELECT * FROM narrow.readings) x",
    "star of a cte": "WITH x AS (SELECT * FROM narrow.readings) SELECT * FROM x",
    "star of a cte over a qualified star": "WITH x AS (SELECT r.* FROM narrow.readings r) SELECT * FROM x",
    "whole-row reference": "SELECT CAST(r AS text) AS row FROM narrow.readings r",
    "whole-row in an aggregate": "SELECT count(r) AS n, max(CAST(r AS text)) AS mx FROM narrow.readings r",
    "whole-row array": "SELECT CAST(array_agg(r ORDER BY r.id) AS text) AS rows FROM narrow.readings r",
    "whole-row of a cte": "WITH x AS (SELECT * FROM narrow.readings) SELECT CAST(x AS text) AS row FROM x",
    "row filter column unexposed, count": "SELECT count(*) AS n FROM narrow.readings",
}

# the functions PostgreSQL offers on a whole row are not on the allowlist; attribute notation
# (`r.to_jsonb`) names no exposed column; field selection is refused outright
WHOLE_ROW_FUNCTIONS = {
    "SELECT row_to_json(r) AS j FROM narrow.readings r": "sql_refused",
    "SELECT to_jsonb(r) AS j FROM narrow.readings r": "sql_refused",
    "SELECT r.to_jsonb FROM narrow.readings r": "column_not_exposed",
    "SELECT r.row_to_json FROM narrow.readings r": "column_not_exposed",
    "SELECT (r).pod FROM narrow.readings r": "sql_refused",
}

SCHEMA_B = """
CREATE SCHEMA narrow;
CREATE TABLE narrow.readings (id integer PRIMARY KEY, value integer NOT NULL);
"""


@contextlib.asynccontextmanager
async def exposed_database(postgres_url: str) -> AsyncIterator[asyncpg.Connection]:
    """Database B: narrow.readings holding only the exposed columns, empty until loaded."""
    async with scratch_connection(postgres_url, SCHEMA_B, "t_x_") as conn:
        yield conn


async def load_exposed(conn: asyncpg.Connection, permit: Permit) -> None:
    """The permitted readings, with only their exposed columns (id, value)."""
    await conn.execute("TRUNCATE narrow.readings")
    rows = [(row[0], row[2]) for row in permit.permitted_rows("readings")]
    await conn.executemany("INSERT INTO narrow.readings VALUES ($1, $2)", rows)


def pseudonym(value: str, key: str = MASK_KEY) -> str:
    """The `hash` mask as the issue defines it: HMAC-SHA-256 of the value's text, hex."""
    return hmac.new(key.encode(), value.encode(), hashlib.sha256).hexdigest()


def masked_sites() -> list[dict[str, object]]:
    """masked.sites as a caller must read it, in site_id order."""
    return [{"site_id": s, "site_uuid": pseudonym(u), "pod": None, "name": n} for s, u, _, n in SITES]
