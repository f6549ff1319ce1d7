# ruff: noqa: E501 - SQL test data reads best on one line
"""A differential oracle for the rewrite, independent of its own verifier: every generated
statement runs through validate → narrow → execute on database A (all rows) and, verbatim, on
database B holding only the permitted rows under the dataset ids' own names; the answers must be
the same multiset. What B holds and which requests are denies is derived from the raw allow-lists
alone (the model below), never from the gateway's own conversion: a touched dataset whose
allow-list keeps no value of its column's type is a deny, and a deny must answer nothing."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import asyncpg
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlgw_support import CATALOGUE, METERS, ORGS, PODS, READINGS, SITE_UUIDS, SITES, Db

from dataplane_contracts.plans import Plan
from query_gateway.sql import validate_query
from query_gateway.sql.execute import jsonable

SCHEMA_B = """
CREATE TABLE public.readings (id integer PRIMARY KEY, pod text NOT NULL, value integer NOT NULL,
                              org text NOT NULL);
CREATE SCHEMA grid;
CREATE TABLE grid.meters (pod text PRIMARY KEY, kind text NOT NULL, org text NOT NULL);
CREATE SCHEMA ops;
CREATE TABLE ops.sites (site_id integer PRIMARY KEY, site_uuid uuid NOT NULL, pod text NOT NULL,
                        name text NOT NULL);
"""


@pytest.fixture
async def db_b(postgres_url: str) -> AsyncIterator[asyncpg.Connection]:
    name = f"t_b_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(postgres_url)
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.close()
    conn = await asyncpg.connect(f"{postgres_url.rpartition('/')[0]}/{name}")
    await conn.execute(SCHEMA_B)
    yield conn
    await conn.close()
    admin = await asyncpg.connect(postgres_url)
    await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await admin.close()


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


def _spellings(u: str) -> list[str]:
    # every spelling converts to the same uuid, so each must match its row
    return [u, u.upper(), "{" + u + "}", u.replace("-", "")]


site_values = (
    st.sampled_from(SITE_UUIDS).flatmap(lambda u: st.sampled_from(_spellings(u)))
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


def _multiset(rows: list[tuple[object, ...]]) -> list[tuple[object, ...]]:
    return sorted(rows, key=repr)


async def _load_permitted(conn: asyncpg.Connection, permit: Permit) -> None:
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


@settings(
    max_examples=50,
    deadline=None,
    derandomize=bool(os.environ.get("CI")),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(sql=statements(), permit=permits)
# no value of the sites allow-list converts: a deny, so not even the count of a cross join
@example(
    sql="SELECT count(*) AS n FROM ops.sites s CROSS JOIN grid.meters m",
    permit=Permit(pods=("pod-1",), orgs=("org-a",), sites=("not-a-uuid",)),
)
@example(
    sql="SELECT count(*) AS n FROM ops.sites s CROSS JOIN grid.meters m",
    permit=Permit(pods=("pod-1",), orgs=("org-a",), sites=()),
)
# other spellings of a permitted uuid match its row; a malformed neighbour is dropped
@example(
    sql="SELECT s.name, s.site_uuid FROM ops.sites s WHERE s.site_uuid = '5b7e7f5c-1111-4a4a-9b9b-000000000001' OR s.pod = 'pod-2'",
    permit=Permit(pods=(), orgs=(), sites=(SITE_UUIDS[0].upper(), "{" + SITE_UUIDS[1] + "}", "42")),
)
async def test_rewrite_matches_a_database_holding_only_permitted_rows(
    db: Db, db_b: asyncpg.Connection, sql: str, permit: Permit
) -> None:
    validated = validate_query(sql, CATALOGUE)  # every generated statement is a valid one
    page = await db.query(sql, permit.plans())
    got = _multiset([tuple(item.values()) for item in page.items])
    if permit.denies(validated.dataset_ids):
        # ARCHITECTURE: a deny puts FALSE into every SELECT, the outer page and count included
        assert (got, page.total) == ([], 0), sql
        return
    await _load_permitted(db_b, permit)
    direct = await db_b.fetch(sql)
    expected = _multiset([tuple(jsonable(v) for v in r.values()) for r in direct])
    assert got == expected, sql
    assert page.total == len(expected)
