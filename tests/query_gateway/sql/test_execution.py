# ruff: noqa: E501 - SQL test data reads best on one line
"""Execution (QE-04, docs/gateway.md): read-only transaction, statement timeout, pagination with a
count (or not), the limit cap, the outer ORDER BY of QE-04, and the error mapping."""

from __future__ import annotations

import asyncpg
import pytest

from dataplane_service_kit.errors import ServiceError
from dataplane_testing.sqlgw import READINGS, Db, allow_all, pods
from query_gateway.sql import MAX_LIMIT, NarrowedQuery, QueryExecutor
from query_gateway.sql.execute import datasets_pool
from query_gateway.sql.pagination import page_and_count


def _raw(sql: str) -> NarrowedQuery:
    """A statement that never went through validation: exercises the executor's own guarantees."""
    return NarrowedQuery(sql=sql, params=(), param_labels=(), denied=False)


async def test_runs_in_a_read_only_transaction(db: Db) -> None:
    page = await db.executor.run(
        _raw(
            "SELECT current_setting('transaction_read_only') AS ro, current_setting('statement_timeout') AS t"
        ),
        offset=0,
        limit=10,
        skip_count=True,
    )
    assert page.items == [{"ro": "on", "t": "5s"}]
    owner = await asyncpg.connect(db.url)  # the pool's sessions are read-only: set up beside it
    try:
        await owner.execute("CREATE SEQUENCE s")
    finally:
        await owner.close()
    with pytest.raises(ServiceError) as err:  # a write inside the statement is refused by PostgreSQL
        await db.executor.run(_raw("SELECT nextval('s') AS n"), offset=0, limit=10, skip_count=True)
    assert (err.value.status_code, err.value.code) == (400, "query_failed")
    assert err.value.detail == "Database query failed"  # no class, no SQLSTATE (issue 19)
    async with db.pool.acquire() as conn:  # refused by PostgreSQL: the sequence never advanced
        assert await conn.fetchval("SELECT is_called FROM s") is False


async def test_statement_timeout_is_query_timeout(db: Db) -> None:
    slow = QueryExecutor(db.pool, statement_timeout_ms=50)
    with pytest.raises(ServiceError) as err:
        await slow.run(_raw("SELECT pg_sleep(5) AS x"), offset=0, limit=10, skip_count=True)
    assert (err.value.code, err.value.status_code) == ("query_timeout", 400)
    # the timeout was local to that transaction: the session keeps its own default
    async with db.pool.acquire() as conn:
        assert await conn.fetchval("SHOW statement_timeout") == "5s"


async def test_statement_timeout_of_the_one_statement_path_is_query_timeout(db: Db) -> None:
    pool = await datasets_pool(db.url, statement_timeout_ms=50, max_size=1)
    try:
        fast = QueryExecutor(pool, 50, session_defaults=True)
        for skip_count in (True, False):
            with pytest.raises(ServiceError) as err:
                await fast.run(_raw("SELECT pg_sleep(5) AS x"), offset=0, limit=10, skip_count=skip_count)
            assert (err.value.code, err.value.status_code) == ("query_timeout", 400)
        # the session is still read-only and usable after the cancelled statements
        page = await fast.run(
            _raw("SELECT current_setting('transaction_read_only') AS ro"), offset=0, limit=1, skip_count=False
        )
        assert page.items == [{"ro": "on"}] and page.total == 1
    finally:
        await pool.close()


@pytest.mark.parametrize("offset", [0, 5, 31, 32, 40])
async def test_qe04_the_total_rides_with_the_page_and_past_the_end_is_counted(db: Db, offset: int) -> None:
    """One statement carries page and total; a page past the end counts in a transaction of its
    own. Either way the total is the whole result's and the total column never reaches a row."""
    page = await db.query("SELECT id, pod FROM readings ORDER BY id", allow_all(), offset=offset, limit=5)
    assert page.total == len(READINGS)
    assert [i["id"] for i in page.items] == [r[0] for r in READINGS][offset : offset + 5]
    assert all(set(i) == {"id", "pod"} for i in page.items)
    narrowed = db.narrow("SELECT id FROM readings", pods("pod-9"))  # no such pod: no row at all
    empty = await db.executor.run(narrowed, offset=offset, limit=5, skip_count=False)
    assert (empty.items, empty.total) == ([], 0)


async def test_sql_error_is_query_failed_without_values(db: Db) -> None:
    narrowed = db.narrow("SELECT CAST(pod AS integer) AS n FROM readings", allow_all())
    with pytest.raises(ServiceError) as err:
        await db.executor.run(narrowed, offset=0, limit=10, skip_count=True)
    assert (err.value.status_code, err.value.code) == (400, "query_failed")
    assert "pod-" not in err.value.detail


async def test_connection_lost_is_database_unavailable(db: Db) -> None:
    with pytest.raises(ServiceError) as err:
        await db.executor.run(
            _raw("SELECT pg_terminate_backend(pg_backend_pid()) AS x"), offset=0, limit=10, skip_count=True
        )
    assert (err.value.code, err.value.status_code) == ("database_unavailable", 503)


async def test_pagination_count_and_skip_count(db: Db) -> None:
    sql = "SELECT id, pod FROM readings ORDER BY id DESC"
    page = await db.query(sql, pods("pod-1", "pod-2"), offset=3, limit=4)
    permitted = sorted((i for i, p, _, _ in READINGS if p in ("pod-1", "pod-2")), reverse=True)
    assert [i["id"] for i in page.items] == permitted[3:7]
    assert (page.offset, page.limit, page.count, page.total) == (3, 4, 4, len(permitted))
    skipped = await db.query(sql, pods("pod-1", "pod-2"), offset=3, limit=4, skip_count=True)
    assert skipped.items == page.items and skipped.total is None
    last = await db.query(sql, pods("pod-1", "pod-2"), offset=len(permitted) - 1, limit=4)
    assert last.count == 1 and last.total == len(permitted)


@pytest.mark.parametrize(
    ("offset", "limit", "applied"),
    [(0, 0, (0, 100)), (-5, -1, (0, 100)), (2, MAX_LIMIT + 1, (2, MAX_LIMIT)), (1, 7, (1, 7))],
)
async def test_limit_cap_and_defaults(db: Db, offset: int, limit: int, applied: tuple[int, int]) -> None:
    page = await db.query("SELECT id FROM readings ORDER BY id", allow_all(), offset=offset, limit=limit)
    assert (page.offset, page.limit) == applied
    ids = sorted(r[0] for r in READINGS)
    assert [i["id"] for i in page.items] == ids[applied[0] : applied[0] + applied[1]]
    assert page.count == len(page.items) and page.total == len(READINGS)


async def test_executor_max_limit_is_enforced(db: Db) -> None:
    capped = QueryExecutor(db.pool, 5000, max_limit=5)
    page = await capped.run(
        db.narrow("SELECT id FROM readings ORDER BY id", allow_all()), offset=0, limit=50, skip_count=False
    )
    assert (page.limit, page.count, page.total) == (5, 5, len(READINGS))
    assert [i["id"] for i in page.items] == sorted(r[0] for r in READINGS)[:5]


QE04 = {
    "bare output name": ("SELECT id, pod FROM readings ORDER BY id DESC", ' ORDER BY q."id" DESC NULLS FIRST'),
    "alias": ("SELECT value AS v FROM readings ORDER BY v", ' ORDER BY q."v" ASC NULLS LAST'),
    "position": ("SELECT id, pod FROM readings ORDER BY 2 DESC NULLS LAST, 1", ' ORDER BY q."pod" DESC NULLS LAST, q."id" ASC NULLS LAST'),
    "expression as selected": ("SELECT r.id FROM readings r ORDER BY r.id", ' ORDER BY q."id" ASC NULLS LAST'),
    "lone star": ("SELECT * FROM readings r ORDER BY r.value, id", ' ORDER BY q."value" ASC NULLS LAST, q."id" ASC NULLS LAST'),
    "not selected": ("SELECT id FROM readings ORDER BY value", ""),
    "one key of two unknown": ("SELECT id FROM readings ORDER BY id, value", ""),
    "unnamed output": ("SELECT value + 1 FROM readings ORDER BY 1", ""),
    "duplicate name": ("SELECT id, value AS id FROM readings ORDER BY id", ""),
    "star beside others": ("SELECT *, id AS i FROM readings ORDER BY id", ""),
    "star over a join": ("SELECT * FROM readings r JOIN grid.meters m ON TRUE ORDER BY r.id", ""),
    "bad position": ("SELECT id FROM readings ORDER BY 3", ""),
    "string literal": ("SELECT id FROM readings ORDER BY 'id'", ""),
}  # fmt: skip


@pytest.mark.parametrize("case", QE04)
def test_qe04_outer_order_by(case: str) -> None:
    from dataplane_testing.sqlgw import CATALOGUE
    from query_gateway.sql import narrow_query, validate_query

    sql, order = QE04[case]
    # every column: a qualified reference is checked against them (issue 19, attribute notation)
    columns = {
        "public.readings": {"id": "integer", "pod": "text", "value": "integer", "org": "text"},
        "meters": {"pod": "text", "kind": "text", "org": "text"},
        'energy."Sites"': {"site_id": "integer", "site_uuid": "uuid", "pod": "text", "name": "text"},
    }
    narrowed = narrow_query(validate_query(sql, CATALOGUE), CATALOGUE, allow_all(), columns)
    page, count = page_and_count(narrowed.sql, 0, denied=False)
    assert tuple(page_and_count(narrowed.sql, 0, False, narrowed.order_by)) == (page, count)  # parse-once
    assert page == f"SELECT * FROM ({narrowed.sql}) AS q{order} LIMIT $1 OFFSET $2"
    assert count == f"SELECT count(*) FROM ({narrowed.sql}) AS q"


async def test_qe04_pages_follow_the_statement_order(db: Db) -> None:
    sql = "SELECT id, value FROM readings ORDER BY value DESC, id"
    ordered = sorted(READINGS, key=lambda r: (-r[2], r[0]))
    got: list[int] = []
    for offset in range(0, len(READINGS), 5):
        page = await db.query(sql, allow_all(), offset=offset, limit=5, skip_count=True)
        got.extend(i["id"] for i in page.items)
    assert got == [r[0] for r in ordered]


async def test_deny_puts_false_into_outer_page_and_count_queries(db: Db) -> None:
    page, count = page_and_count("SELECT 1 AS x", 0, denied=True)
    assert " AS q WHERE FALSE LIMIT" in page and count.endswith(" AS q WHERE FALSE")
    async with db.pool.acquire() as conn:
        assert await conn.fetch(page, 10, 0) == [] and await conn.fetchval(count) == 0


async def test_pool_unreachable_is_database_unavailable() -> None:
    pool = await asyncpg.create_pool("postgresql://postgres@127.0.0.1:1/none", min_size=0, max_size=1)
    try:
        with pytest.raises(ServiceError) as err:
            await QueryExecutor(pool, 5000).run(_raw("SELECT 1 AS x"), offset=0, limit=1, skip_count=True)
        assert (err.value.status_code, err.value.code) == (503, "database_unavailable")
    finally:
        await pool.close()


@pytest.mark.parametrize("session_defaults", [True, False])
async def test_qe06_the_cost_guard_refuses_on_the_estimate_with_its_bound_values(
    db: Db, session_defaults: bool
) -> None:
    """Both ways of running a page (the one-statement path and the transaction): the estimate of
    the statement with its parameters bound; above the limit refused with the number only, below
    it served; a limit of 0 asks for no estimate at all."""
    cross = NarrowedQuery(
        sql="SELECT a.x FROM generate_series(1, $1::int) a(x), generate_series(1, $1::int) b(y)",
        params=(1_000_000,),
        param_labels=("n",),
        denied=False,
    )
    guarded = QueryExecutor(db.pool, 5000, session_defaults=session_defaults, max_plan_cost=1_000_000)
    with pytest.raises(ServiceError) as err:
        await guarded.run(cross, offset=0, limit=10, skip_count=True)
    assert (err.value.status_code, err.value.code) == (400, "query_too_expensive")
    assert (
        err.value.detail.startswith("the query's estimated cost ")
        and "generate_series" not in err.value.detail
    )
    small = NarrowedQuery(sql=cross.sql, params=(3,), param_labels=("n",), denied=False)
    page = await guarded.run(small, offset=0, limit=100, skip_count=False)
    assert (page.count, page.total) == (9, 9)
    unguarded = QueryExecutor(db.pool, 5000, session_defaults=session_defaults)
    page = await unguarded.run(cross, offset=0, limit=3, skip_count=True)
    assert page.count == 3
