"""RF-05: an empty allow-list is a deny, and a deny empties the whole statement: FALSE in every
SELECT (CTE bodies, subqueries, the outer page and count queries), no `IN ()` anywhere."""

from __future__ import annotations

import re

from sqlgw_support import Db, allow_all, pods

from dataplane_contracts.plans import Plan

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
    # run without the outer queries, each aggregate sees an empty input, even over meters and
    # sites, which the deny did not name: nothing of the statement is read
    async with db.pool.acquire() as conn:
        rows = await conn.fetch(narrowed.sql, *narrowed.params)
    assert rows == []  # the outermost SELECT itself has FALSE
    inner = "SELECT count(*) AS n FROM (SELECT * FROM readings) s"
    sub = db.narrow(inner, plans)
    async with db.pool.acquire() as conn:
        assert await conn.fetchval(sub.sql, *sub.params) == 0


async def test_rf05_empty_allow_list_after_conversion_is_a_deny(db: Db) -> None:
    # only non-convertible uuids: nothing left to allow, so a deny, never IN () nor no filter
    plans = {**allow_all(), "ops.sites": [Plan.among("site_uuid", ["nope", "42"])]}
    narrowed = db.narrow("SELECT count(*) AS n FROM ops.sites", plans)
    assert narrowed.denied
    _no_in_list(narrowed.sql)
    page = await db.executor.run(narrowed, offset=0, limit=10, skip_count=False)
    assert page.items == [] and page.total == 0


async def test_rf05_allow_list_filters_and_skipped_layer_does_not_widen(db: Db) -> None:
    narrowed = db.narrow("SELECT count(*) AS n FROM readings", pods("pod-2"))
    _no_in_list(narrowed.sql)
    page = await db.executor.run(narrowed, offset=0, limit=10, skip_count=False)
    assert page.items == [{"n": 8}]
