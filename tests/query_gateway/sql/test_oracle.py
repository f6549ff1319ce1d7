# ruff: noqa: E501 - SQL test data reads best on one line
"""A differential oracle for the rewrite, independent of its own verifier: every generated
statement runs through validate → narrow → execute on database A (all rows) and, verbatim, on
database B holding only the permitted rows under the dataset ids' own names; the answers must be
the same multiset. A deny must answer nothing."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
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


@dataclass(frozen=True)
class Permit:
    pods: frozenset[str]
    orgs: frozenset[str]
    sites: frozenset[str] | None  # None: the sites dataset is not narrowed

    def plans(self) -> dict[str, list[Plan]]:
        site_plan = (
            []
            if self.sites is None
            # a malformed value rides along: it must be dropped, never match, never fail the query
            else [Plan.among("site_uuid", [*sorted(self.sites), "not-a-uuid"])]
        )
        return {
            "readings": [Plan.among("pod", sorted(self.pods)), Plan.among("org", sorted(self.orgs))],
            "grid.meters": [Plan.among("pod", sorted(self.pods))],
            "ops.sites": site_plan,
        }

    def denies(self, dataset_ids: tuple[str, ...]) -> bool:
        empty = {"readings": not self.pods or not self.orgs, "grid.meters": not self.pods, "ops.sites": False}
        return any(empty[d] for d in dataset_ids)


permits = st.builds(
    Permit,
    pods=st.frozensets(st.sampled_from(PODS), max_size=4),
    orgs=st.frozensets(st.sampled_from(ORGS), min_size=1, max_size=2) | st.just(frozenset()),
    sites=st.none() | st.frozensets(st.sampled_from(SITE_UUIDS), max_size=4),
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
        "INSERT INTO public.readings VALUES ($1, $2, $3, $4)",
        [r for r in READINGS if r[1] in permit.pods and r[3] in permit.orgs],
    )
    await conn.executemany(
        "INSERT INTO grid.meters VALUES ($1, $2, $3)", [m for m in METERS if m[0] in permit.pods]
    )
    await conn.executemany(
        "INSERT INTO ops.sites VALUES ($1, $2::uuid, $3, $4)",
        [s for s in SITES if permit.sites is None or s[1] in permit.sites],
    )


@settings(
    max_examples=50,
    deadline=None,
    derandomize=bool(os.environ.get("CI")),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(sql=statements(), permit=permits)
async def test_rewrite_matches_a_database_holding_only_permitted_rows(
    db: Db, db_b: asyncpg.Connection, sql: str, permit: Permit
) -> None:
    validated = validate_query(sql, CATALOGUE)  # every generated statement is a valid one
    page = await db.query(sql, permit.plans())
    got = _multiset([tuple(item.values()) for item in page.items])
    if permit.denies(validated.dataset_ids):
        assert got == [] and page.total == 0
        return
    await _load_permitted(db_b, permit)
    direct = await db_b.fetch(sql)
    expected = _multiset([tuple(jsonable(v) for v in r.values()) for r in direct])
    assert got == expected, sql
    assert page.total == len(expected)
