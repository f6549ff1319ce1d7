# ruff: noqa: E501 - SQL test data reads best on one line
"""Shared data and helpers of the SQL-layer tests: three small tables (one in another schema, its
name in mixed case), their catalogue, plan builders, and a handle on a seeded database. Also the
differential oracle's model, shared by the oracle over the SQL pipeline
(query_gateway/sql/test_oracle.py) and the one over the gateway's HTTP route
(query_gateway/test_oracle_http.py): the statements it generates, the
allow-lists of a request (`Permit`) with the rows they permit, and database B holding only those."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass

import asyncpg
from hypothesis import strategies as st

from dataplane_contracts.catalogue import Catalogue
from dataplane_contracts.plans import Plan
from dataplane_testing.databases import scratch_connection
from query_gateway.sql import (
    ColumnTypes,
    NarrowedQuery,
    QueryExecutor,
    QueryPage,
    narrow_query,
    validate_query,
)

PODS = ("pod-1", "pod-2", "pod-3", "pod-4")
ORGS = ("org-a", "org-b")
SITE_UUIDS = (
    "5b7e7f5c-1111-4a4a-9b9b-000000000001",
    "5b7e7f5c-2222-4a4a-9b9b-000000000002",
    "5b7e7f5c-3333-4a4a-9b9b-000000000003",
    "5b7e7f5c-4444-4a4a-9b9b-000000000004",
)

# id, pod, value, org
READINGS = [(i, PODS[i % 4], (i * 7) % 23, ORGS[(i // 4) % 2]) for i in range(1, 33)]
# pod, kind, org (pod-5 exists only here)
METERS = [(p, "k1" if n % 2 else "k2", ORGS[n % 2]) for n, p in enumerate((*PODS, "pod-5"))]
# site_id, site_uuid, pod, name
SITES = [(n + 1, u, PODS[n % 4], f"site {n + 1}") for n, u in enumerate(SITE_UUIDS)]

SCHEMA_A = """
CREATE TABLE public.readings (id integer PRIMARY KEY, pod text NOT NULL, value integer NOT NULL,
                              org text NOT NULL);
CREATE TABLE public.meters (pod text PRIMARY KEY, kind text NOT NULL, org text NOT NULL);
CREATE SCHEMA energy;
CREATE TABLE energy."Sites" (site_id integer PRIMARY KEY, site_uuid uuid NOT NULL, pod text NOT NULL,
                             name text NOT NULL);
"""

CATALOGUE = Catalogue.model_validate(
    {
        "datasets": [
            {
                "id": "readings",
                "table": "public.readings",
                "row_filters": {
                    "person": {"handler": "subject_key_match", "args": {"column": "pod", "key_type": "pod"}},
                    "organization": {"handler": "organization_match", "args": {"column": "org"}},
                },
            },
            {
                "id": "grid.meters",
                "table": "meters",
                "row_filters": {
                    "person": {"handler": "subject_key_match", "args": {"column": "pod", "key_type": "pod"}},
                    "organization": {"handler": "member_wide"},
                },
            },
            {
                "id": "ops.sites",
                "table": 'energy."Sites"',
                "row_filters": {
                    "person": {
                        "handler": "direct_user_match",
                        "args": {"column": "site_uuid"},
                    },
                    "organization": {"handler": "member_wide"},
                },
            },
        ]
    }
)


async def seed(conn: asyncpg.Connection, readings: str, meters: str, sites: str) -> None:
    await conn.executemany(f"INSERT INTO {readings} VALUES ($1, $2, $3, $4)", READINGS)
    await conn.executemany(f"INSERT INTO {meters} VALUES ($1, $2, $3)", METERS)
    await conn.executemany(
        f"INSERT INTO {sites} VALUES ($1, $2::uuid, $3, $4)", [(a, b, c, d) for a, b, c, d in SITES]
    )


@dataclass
class Db:
    url: str
    pool: asyncpg.Pool
    columns: ColumnTypes
    executor: QueryExecutor

    async def query(
        self,
        sql: str,
        plans: Mapping[str, Sequence[Plan]],
        *,
        offset: int = 0,
        limit: int = 10_000,
        skip_count: bool = False,
        catalogue: Catalogue = CATALOGUE,
    ) -> QueryPage:
        narrowed = self.narrow(sql, plans, catalogue=catalogue)
        return await self.executor.run(narrowed, offset=offset, limit=limit, skip_count=skip_count)

    def narrow(
        self, sql: str, plans: Mapping[str, Sequence[Plan]], *, catalogue: Catalogue = CATALOGUE
    ) -> NarrowedQuery:
        return narrow_query(validate_query(sql, catalogue), catalogue, plans, self.columns)


def allow_all() -> dict[str, list[Plan]]:
    return {d.id: [] for d in CATALOGUE.datasets}


def pods(*values: str) -> dict[str, list[Plan]]:
    """Readings and meters narrowed to these pods; sites unfiltered."""
    return {
        "readings": [Plan.among("pod", list(values), key_type="pod", label="pod keys")],
        "grid.meters": [Plan.among("pod", list(values), key_type="pod", label="pod keys")],
        "ops.sites": [],
    }


# ---------------------------------------------------------------------------- the oracle's model
SCHEMA_B = """
CREATE TABLE public.readings (id integer PRIMARY KEY, pod text NOT NULL, value integer NOT NULL,
                              org text NOT NULL);
CREATE SCHEMA grid;
CREATE TABLE grid.meters (pod text PRIMARY KEY, kind text NOT NULL, org text NOT NULL);
CREATE SCHEMA ops;
CREATE TABLE ops.sites (site_id integer PRIMARY KEY, site_uuid uuid NOT NULL, pod text NOT NULL,
                        name text NOT NULL);
"""


@contextlib.asynccontextmanager
async def permitted_database(postgres_url: str) -> AsyncIterator[asyncpg.Connection]:
    """Database B: the tables under the dataset ids' own names, empty until `load_permitted`."""
    async with scratch_connection(postgres_url, SCHEMA_B, "t_b_") as conn:
        yield conn


# The oracle's own reading of an allow-list value as its column's type, as canonical text: None
# when no row can ever hold it (not a uuid; a NUL, which PostgreSQL text cannot store).
def _as_column_value(value: str, column_type: str) -> str | None:
    if "\x00" in value:
        return None
    if column_type == "uuid":
        try:
            return str(uuid.UUID(value))
        except ValueError:
            return None
    return value


@dataclass(frozen=True)
class Table:
    columns: tuple[str, ...]
    types: dict[str, str]  # the filter columns' types
    rows: list[tuple[object, ...]]


TABLES = {
    "readings": Table(("id", "pod", "value", "org"), {"pod": "text", "org": "text"}, list(READINGS)),
    "grid.meters": Table(("pod", "kind", "org"), {"pod": "text"}, list(METERS)),
    "ops.sites": Table(("site_id", "site_uuid", "pod", "name"), {"site_uuid": "uuid"}, list(SITES)),
}


@dataclass(frozen=True)
class Permit:
    """The allow-lists of one request, as raw values. What a correct rewrite must answer is
    derived from these alone: a dataset whose allow-list keeps no value of its column's type is
    a deny (the whole statement answers nothing); otherwise it contributes exactly the rows whose
    columns hold one of the kept values."""

    pods: tuple[str, ...]
    orgs: tuple[str, ...]
    sites: tuple[str, ...] | None  # None: the sites dataset is not narrowed

    def allow_lists(self) -> dict[str, list[tuple[str, tuple[str, ...]]]]:
        return {
            "readings": [("pod", self.pods), ("org", self.orgs)],
            "grid.meters": [("pod", self.pods)],
            "ops.sites": [] if self.sites is None else [("site_uuid", self.sites)],
        }

    def plans(self) -> dict[str, list[Plan]]:
        # Plan.among of nothing is already a deny plan; of only malformed values an `in` plan the
        # gateway must turn into a deny itself
        return {
            ds: [Plan.among(column, list(values)) for column, values in lists]
            for ds, lists in self.allow_lists().items()
        }

    def kept(self, dataset_id: str) -> dict[str, frozenset[str]] | None:
        """Column → the values a permitted row may hold; None when the dataset is denied."""
        table = TABLES[dataset_id]
        out: dict[str, frozenset[str]] = {}
        for column, values in self.allow_lists()[dataset_id]:
            kept = {c for v in values if (c := _as_column_value(v, table.types[column])) is not None}
            if not kept:
                return None
            out[column] = frozenset(kept)
        return out

    def permitted_rows(self, dataset_id: str) -> list[tuple[object, ...]]:
        kept = self.kept(dataset_id)
        if kept is None:
            return []
        table = TABLES[dataset_id]
        return [
            row
            for row in table.rows
            if all(str(row[table.columns.index(c)]) in values for c, values in kept.items())
        ]

    def denies(self, dataset_ids: tuple[str, ...]) -> bool:
        return any(self.kept(d) is None for d in dataset_ids)


def spellings(u: str) -> list[str]:
    # every spelling converts to the same uuid, so each must match its row
    return [u, u.upper(), "{" + u + "}", u.replace("-", "")]


site_values = (
    st.sampled_from(SITE_UUIDS).flatmap(lambda u: st.sampled_from(spellings(u)))
    # malformed values ride along: dropped, never matching, never failing the query
    | st.sampled_from(["not-a-uuid", "42", "", SITE_UUIDS[0][:-1]])
)
permits = st.builds(
    Permit,
    pods=st.lists(st.sampled_from((*PODS, "pod-5", "pod-1\x00")), max_size=4).map(tuple),
    orgs=st.lists(st.sampled_from(ORGS), min_size=1, max_size=2).map(tuple) | st.just(()),
    sites=st.none() | st.lists(site_values, max_size=5).map(tuple),
)

FORGED_PODS = (*PODS, "pod-5")
cond_r = st.sampled_from(
    ["", "WHERE {a}.value > {n}", "WHERE {a}.pod = '{p}'", "WHERE {a}.pod IN ('{p}', 'pod-4')",
     "WHERE {a}.org = 'org-b'", "WHERE {a}.pod = '{p}' OR {a}.value < {n}"]
)  # fmt: skip


@st.composite
def statements(draw: st.DrawFn) -> str:
    n = draw(st.integers(0, 22))
    p = draw(st.sampled_from(FORGED_PODS))
    u = draw(st.sampled_from(SITE_UUIDS))
    where = draw(cond_r).format(a="r", n=n, p=p)
    join = draw(st.sampled_from(["JOIN", "LEFT JOIN", "RIGHT JOIN", "FULL JOIN"]))
    templates = [
        f"SELECT r.id, r.pod, r.value FROM readings r {where}",
        f"SELECT '{p}' AS pod, count(*) AS n, sum(r.value) AS total FROM readings r {where}",
        f"SELECT r.pod, count(*) AS n, max(r.value) AS mx FROM readings r {where} GROUP BY r.pod",
        f"SELECT r.id, m.kind FROM readings r {join} grid.meters m ON r.pod = m.pod {where}",
        f"SELECT m.pod, m.kind FROM grid.meters m {join} readings r ON r.pod = m.pod {where}",
        "SELECT r.id, m.kind, s.name FROM readings r JOIN grid.meters m ON m.pod = r.pod "
        "LEFT JOIN ops.sites s ON s.pod = r.pod",
        f"WITH x AS (SELECT r.* FROM readings r {where}) SELECT x.pod, sum(x.value) AS total FROM x GROUP BY x.pod",
        f"WITH readings AS (SELECT * FROM readings WHERE value > {n}) SELECT pod, value FROM readings",
        "WITH a AS (SELECT pod FROM grid.meters WHERE kind = 'k1'), b AS (SELECT r.id FROM readings r "
        "JOIN a ON a.pod = r.pod) SELECT count(*) AS n FROM b",
        f"SELECT r.id FROM readings r WHERE r.pod IN (SELECT pod FROM grid.meters WHERE kind = 'k{1 + n % 2}')",
        "SELECT m.pod, (SELECT count(*) FROM readings r WHERE r.pod = m.pod) AS n FROM grid.meters m",
        f"SELECT '{p}' AS pod, (SELECT sum(value) FROM readings) AS total FROM ops.sites s WHERE s.site_uuid = '{u}'",
        "SELECT m.pod, l.value FROM grid.meters m, "
        "LATERAL (SELECT r.value FROM readings r WHERE r.pod = m.pod ORDER BY r.value DESC, r.id DESC LIMIT 2) l",
        f"SELECT r.id, row_number() OVER (PARTITION BY r.pod ORDER BY r.id) AS rn FROM readings r {where}",
        f"SELECT d.pod, max(d.value) AS mx FROM (SELECT * FROM readings WHERE value >= {n}) d GROUP BY d.pod",
        f"SELECT s.name, s.site_uuid FROM ops.sites s WHERE s.site_uuid = '{u}' OR s.pod = '{p}'",
        "SELECT count(*) AS n FROM ops.sites s CROSS JOIN grid.meters m",
        f"SELECT * FROM readings r {where} ORDER BY r.id",
    ]
    return draw(st.sampled_from(templates))


# Issue 19: predicates that raise on one chosen (pod, value) — a division by zero or a failing
# cast — in every clause a caller's predicate can sit in. The row they aim at may be permitted
# (then B raises too) or forbidden (then B holds no such row).
RAISE = "1 / (CASE WHEN {a}.pod = '{p}' AND {a}.value = {n} THEN 0 ELSE 1 END) = 1"
CAST_RAISE = "CAST(CASE WHEN {a}.pod = '{p}' AND {a}.value = {n} THEN 'x' ELSE '1' END AS integer) = 1"
# Each guard's quiet twins: the same predicate, but on the aimed-at row it answers NULL (the row
# does not pass), then TRUE (it passes), where the guard raises. Every other row gets what it got.
QUIET = {
    RAISE: (
        "1 / (CASE WHEN {a}.pod = '{p}' AND {a}.value = {n} THEN NULL ELSE 1 END) = 1",
        "1 / (CASE WHEN {a}.pod = '{p}' AND {a}.value = {n} THEN 1 ELSE 1 END) = 1",
    ),
    CAST_RAISE: (
        "CAST(CASE WHEN {a}.pod = '{p}' AND {a}.value = {n} THEN NULL ELSE '1' END AS integer) = 1",
        "CAST(CASE WHEN {a}.pod = '{p}' AND {a}.value = {n} THEN '1' ELSE '1' END AS integer) = 1",
    ),
}


def _raising_templates(on: Callable[[str], str]) -> dict[str, str]:
    """The statements, by the clause the guard sits in; `on(alias)` is the guard over that alias."""
    return {
        "where": f"SELECT r.id, r.pod FROM readings r WHERE {on('r')}",
        "where, beside another condition": f"SELECT r.id FROM readings r WHERE r.org = 'org-a' AND {on('r')}",
        "join on": f"SELECT a.id FROM readings a JOIN readings b ON a.id = b.id AND {on('b')}",
        "left join on": f"SELECT r.id, m.kind FROM readings r LEFT JOIN grid.meters m ON m.pod = r.pod AND {on('r')}",
        "having": f"SELECT r.pod, r.value, count(*) AS n FROM readings r GROUP BY r.pod, r.value HAVING {on('r')}",
        "materialized cte": f"WITH c AS MATERIALIZED (SELECT * FROM readings x WHERE {on('x')}) SELECT c.id FROM c",
        "inlined cte": f"WITH c AS (SELECT * FROM readings) SELECT c.id FROM c WHERE {on('c')}",
        "derived table": f"SELECT d.id FROM (SELECT * FROM readings x) d WHERE {on('d')}",
        "in subquery": f"SELECT m.pod FROM grid.meters m WHERE m.pod IN (SELECT r.pod FROM readings r WHERE {on('r')})",
        "count": f"SELECT count(*) AS n FROM readings r WHERE {on('r')}",
    }


RAISING_POSITIONS = tuple(_raising_templates(str))


@dataclass(frozen=True)
class Raising:
    """A statement whose guard raises on the aimed-at row, and its quiet twins (`QUIET`): the same
    statement with the guard answering NULL, then TRUE, on that row instead of raising.

    Why the twins: SQL does not say on which rows a predicate is evaluated, and PostgreSQL skips
    rows whenever the plan allows. A semi-join driven by a nested loop stops at the first inner
    row that matches, so the aimed-at row behind it is never read, while a hash semi-join on B
    evaluates the guard on every row first. Where the guard is never evaluated on the aimed-at
    row, what it would have answered there cannot change the rows: they equal both twins' rows."""

    sql: str
    twins: tuple[str, str]


def raising_statement(position: str, guard: str, p: str, n: int) -> Raising:
    """The statement at `position` (one of RAISING_POSITIONS) with `guard` aimed at (p, n)."""

    def build(g: str) -> str:
        return _raising_templates(lambda a: g.format(a=a, p=p, n=n))[position]

    null, true = QUIET[guard]
    return Raising(build(guard), (build(null), build(true)))


@st.composite
def raising_statements(draw: st.DrawFn) -> Raising:
    n = draw(st.sampled_from(sorted({v for _, _, v, _ in READINGS})))
    p = draw(st.sampled_from(FORGED_PODS))
    guard = draw(st.sampled_from([RAISE, CAST_RAISE]))
    return raising_statement(draw(st.sampled_from(RAISING_POSITIONS)), guard, p, n)


def multiset(rows: list[tuple[object, ...]]) -> list[tuple[object, ...]]:
    return sorted(rows, key=repr)


async def load_permitted(conn: asyncpg.Connection, permit: Permit) -> None:
    await conn.execute("TRUNCATE public.readings, grid.meters, ops.sites")
    await conn.executemany(
        "INSERT INTO public.readings VALUES ($1, $2, $3, $4)", permit.permitted_rows("readings")
    )
    await conn.executemany(
        "INSERT INTO grid.meters VALUES ($1, $2, $3)", permit.permitted_rows("grid.meters")
    )
    await conn.executemany(
        "INSERT INTO ops.sites VALUES ($1, $2::uuid, $3, $4)", permit.permitted_rows("ops.sites")
    )
