"""RF-05: an empty allow-list is a deny, and a deny empties the whole statement: FALSE in every
SELECT (CTE bodies, subqueries, the outer page and count queries), no `IN ()` anywhere."""

from __future__ import annotations

import re

import sqlglot
from sqlglot import exp

from dataplane_contracts.plans import Plan
from dataplane_testing.sqlgw import METERS, READINGS, Db, allow_all, pods

DENY_UNDER_CTE_AND_SUBQUERY = (
    "WITH x AS (SELECT * FROM readings) "
    "SELECT (SELECT count(*) FROM x) AS n_cte, "
    "(SELECT count(*) FROM (SELECT * FROM readings) s) AS n_sub, "
    "(SELECT count(*) FROM grid.meters) AS n_meters "
    "FROM ops.sites WHERE site_id = 1"
)


def _no_in_list(sql: str) -> None:
    assert not re.search(r"\bIN\s*\(\s*\)", sql, re.IGNORECASE)


async def test_rf05_deny_under_cte_and_subquery_reads_no_rows(db: Db) -> None:
    plans = {**allow_all(), "readings": [Plan.deny(key_type="pod")]}
    narrowed = db.narrow(DENY_UNDER_CTE_AND_SUBQUERY, plans)
    assert narrowed.denied and narrowed.params == ()
    _no_in_list(narrowed.sql)
    # every SELECT carries FALSE: as many as there are SELECTs in the statement
    assert narrowed.sql.count("SELECT") == narrowed.sql.count("FALSE")
    page = await db.executor.run(narrowed, offset=0, limit=100, skip_count=False)
    assert page.items == [] and page.total == 0 and page.count == 0
    # the outermost FALSE alone would hide what the inner SELECTs read: drop the outer FROM and
    # WHERE and each aggregate must still see an empty input — the CTE, the subquery and meters,
    # which the deny did not name: nothing of the statement is read
    async with db.pool.acquire() as conn:
        inner = await conn.fetch(_scalars_only(narrowed.sql), *narrowed.params)
        assert [tuple(r.values()) for r in inner] == [(0, 0, 0)]
        cte_body = sqlglot.parse_one(narrowed.sql, read="postgres").find(exp.CTE)
        assert cte_body is not None
        assert await conn.fetch(cte_body.this.sql(dialect="postgres")) == []
        # the same surgery on the allowed statement does read rows: the check above can fail
        allowed = db.narrow(DENY_UNDER_CTE_AND_SUBQUERY, allow_all())
        rows = await conn.fetch(_scalars_only(allowed.sql), *allowed.params)
        assert [tuple(r.values()) for r in rows] == [(len(READINGS), len(READINGS), len(METERS))]


def _scalars_only(sql: str) -> str:
    """The statement's projection of scalar subqueries, without its own FROM and WHERE."""
    tree = sqlglot.parse_one(sql, read="postgres")
    for key in ("from", "from_", "where"):  # the FROM key's name differs by sqlglot version
        if tree.args.get(key) is not None:
            tree.set(key, None)
    return tree.sql(dialect="postgres")


async def test_rf05_empty_allow_list_after_conversion_is_a_deny(db: Db) -> None:
    # only non-convertible uuids: nothing left to allow, so a deny, never IN () nor no filter
    plans = {**allow_all(), "ops.sites": [Plan.among("site_uuid", ["nope", "42"])]}
    narrowed = db.narrow("SELECT count(*) AS n FROM ops.sites", plans)
    assert narrowed.denied
    _no_in_list(narrowed.sql)
    page = await db.executor.run(narrowed, offset=0, limit=10, skip_count=False)
    assert page.items == [] and page.total == 0


async def test_rf05_allow_all_layer_beside_an_allow_list_does_not_widen(db: Db) -> None:
    # one layer allows everything (member_wide), the other names pod-2: only pod-2 is read
    plans = {**allow_all(), "readings": [Plan.allow_all(), *pods("pod-2")["readings"]]}
    narrowed = db.narrow("SELECT count(*) AS n, min(pod) AS lo, max(pod) AS hi FROM readings", plans)
    _no_in_list(narrowed.sql)
    page = await db.executor.run(narrowed, offset=0, limit=10, skip_count=False)
    n = sum(1 for r in READINGS if r[1] == "pod-2")
    assert page.items == [{"n": n, "lo": "pod-2", "hi": "pod-2"}] and n > 0
