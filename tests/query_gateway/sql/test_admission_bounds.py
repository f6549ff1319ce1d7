"""Issue 34's database-side bounds, against a real PostgreSQL: the sessions' memory settings, a
resource bound exceeded is a coded 400 (never a 503 "retry"), a busy pool is a coded 503 that says
so, the cost guard reads the costliest node (QE-06), and a consumer's share of the pool (QE-10)."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import pytest

from dataplane_local.provision import with_database
from dataplane_service_kit.errors import ServiceError
from dataplane_testing.sqlgw import Db
from query_gateway.clients.concurrency import ConsumerSlots
from query_gateway.pipeline import caller_identity, caller_key, consumer_key
from query_gateway.rules.caller import Caller
from query_gateway.sql import NarrowedQuery, QueryExecutor
from query_gateway.sql.cost_calibration import largest_cost
from query_gateway.sql.execute import SESSION_BOUNDS, datasets_pool


def _raw(sql: str, *params: object) -> NarrowedQuery:
    return NarrowedQuery(
        sql=sql, params=params, param_labels=tuple(f"p{i}" for i in range(len(params))), denied=False
    )


async def test_datasets_sessions_carry_the_memory_bounds(db: Db) -> None:
    page = await db.executor.run(
        _raw(
            "SELECT current_setting('work_mem') AS w, current_setting('hash_mem_multiplier') AS h,"
            " current_setting('max_parallel_workers_per_gather') AS p"
        ),
        offset=0,
        limit=1,
        skip_count=True,
    )
    assert page.items == [{"w": SESSION_BOUNDS["work_mem"], "h": "1", "p": "0"}]


async def test_temp_file_limit_exceeded_is_a_coded_400(fresh_database: str) -> None:
    """The reader role's temp_file_limit (set by the role's set-up, here on a role made for the
    test) stops a sort that spills; the answer is 400 query_resources_exceeded, never 503."""
    admin = await asyncpg.connect(fresh_database)
    role = f"admission_reader_{uuid.uuid4().hex[:8]}"  # roles are the server's, not the database's
    try:
        await admin.execute(f"CREATE ROLE {role} LOGIN")
        await admin.execute(f"ALTER ROLE {role} SET temp_file_limit = '1MB'")
        database = await admin.fetchval("SELECT current_database()")
        await admin.execute(f'GRANT CONNECT ON DATABASE "{database}" TO {role}')
    finally:
        await admin.close()
    url = with_database(fresh_database, database, user=role)
    pool = await datasets_pool(url, statement_timeout_ms=20_000, max_size=1)
    try:
        executor = QueryExecutor(pool, 20_000, session_defaults=True)
        spill = _raw("SELECT count(DISTINCT md5(g::text)) AS n FROM generate_series(1, 2000000) g")
        with pytest.raises(ServiceError) as err:
            await executor.run(spill, offset=0, limit=1, skip_count=True)
        assert (err.value.status_code, err.value.code) == (400, "query_resources_exceeded")
        assert err.value.detail == "the query needs more memory or temporary space than one query may use"
        # the pool's one connection is fine afterwards: one refused statement, not an outage
        page = await executor.run(_raw("SELECT 1 AS one"), offset=0, limit=1, skip_count=True)
        assert page.items == [{"one": 1}]
    finally:
        await pool.close()


async def test_a_busy_pool_is_database_busy_not_connection_lost(fresh_database: str) -> None:
    pool = await datasets_pool(fresh_database, statement_timeout_ms=5_000, max_size=1)
    try:
        executor = QueryExecutor(pool, 5_000, session_defaults=True, acquire_timeout_s=0.2)
        async with pool.acquire():  # the pool's only connection is lent out
            with pytest.raises(ServiceError) as err:
                await executor.run(_raw("SELECT 1 AS one"), offset=0, limit=1, skip_count=True)
        assert (err.value.status_code, err.value.code) == (503, "database_busy")
        assert err.value.headers == {"Retry-After": "1"}
        page = await executor.run(_raw("SELECT 1 AS one"), offset=0, limit=1, skip_count=True)
        assert page.items == [{"one": 1}]
    finally:
        await pool.close()


def test_qe06_the_guard_reads_the_costliest_node_not_the_root() -> None:
    plan = {
        "Node Type": "Limit",
        "Total Cost": 12.0,
        "Plans": [{"Node Type": "WindowAgg", "Total Cost": 9_000_000.0, "Plans": [{"Total Cost": 5.0}]}],
    }
    assert largest_cost(plan) == 9_000_000.0


async def test_qe06_a_cross_join_window_under_a_limit_is_refused(db: Db) -> None:
    """The page's LIMIT discounts the root's estimate; the window below it reads every row."""
    window = _raw(
        "SELECT rank() OVER (ORDER BY a.x, b.y) AS r FROM generate_series(1, 100000) a(x),"
        " generate_series(1, 100000) b(y) LIMIT 1"
    )
    guarded = QueryExecutor(db.pool, 5000, session_defaults=True, max_plan_cost=1_000_000)
    with pytest.raises(ServiceError) as err:
        await guarded.run(window, offset=0, limit=1, skip_count=True)
    assert err.value.code == "query_too_expensive"


CROSS_JOIN_WINDOW = (
    "SELECT rank() OVER (ORDER BY md5(a.x::text), b.y) AS r FROM generate_series(1, 3000) a(x),"
    " generate_series(1, 3000) b(y) LIMIT 1"
)


async def test_qe06_the_calibrated_guard_refuses_what_cannot_finish_inside_the_timeout(db: Db) -> None:
    """No fixed threshold: the guard measures the database's pace and refuses an estimate that
    would need more than the statement timeout at it. A cross-join window of 9 million rows by a
    text key (tens of seconds here) is refused before it runs; the page statements are not."""
    calibrated = QueryExecutor(db.pool, 5000, session_defaults=True)
    assert calibrated.max_plan_cost == 0  # nothing asked before the calibration
    per_ms = await calibrated.calibrate()
    assert per_ms > 0 and calibrated.max_plan_cost == pytest.approx(per_ms * 5000)
    with pytest.raises(ServiceError) as err:
        await calibrated.run(_raw(CROSS_JOIN_WINDOW), offset=0, limit=1, skip_count=True)
    assert err.value.code == "query_too_expensive"
    page = await calibrated.run(
        _raw("SELECT x FROM generate_series(1, 10) AS g(x)"), offset=0, limit=5, skip_count=False
    )
    assert (page.count, page.total) == (5, 10)
    fixed = QueryExecutor(db.pool, 5000, session_defaults=True, max_plan_cost=1000)
    await fixed.calibrate()
    assert fixed.max_plan_cost == 1000  # a lower fixed ceiling stays the ceiling


async def test_qe06_an_estimate_is_asked_once_per_statement_and_bound_values(db: Db) -> None:
    """A consumer repeating one statement pays one EXPLAIN, not one per request; other bound
    values are another statement to the planner and are estimated again; a reload forgets all."""
    sent: list[str] = []

    async def watched(conn: asyncpg.Connection) -> None:
        conn.add_query_logger(lambda record: sent.append(record.query))

    pool = await asyncpg.create_pool(db.url, min_size=1, max_size=1, init=watched)
    try:
        guarded = QueryExecutor(pool, 5000, session_defaults=True, max_plan_cost=1_000_000)

        def explains() -> int:
            return sum(1 for q in sent if q.startswith("EXPLAIN"))

        statement = "SELECT x FROM generate_series(1, $1::int) AS g(x)"
        for _ in range(3):
            page = await guarded.run(_raw(statement, 10), offset=0, limit=5, skip_count=True)
            assert page.count == 5
        assert explains() == 1
        await guarded.run(_raw(statement, 20), offset=0, limit=5, skip_count=True)
        assert explains() == 2
        guarded.forget_estimates()
        await guarded.run(_raw(statement, 10), offset=0, limit=5, skip_count=True)
        assert explains() == 3
        # what is kept is the estimate, not the verdict: a lower limit refuses the kept one at once
        lowered = QueryExecutor(pool, 5000, session_defaults=True, max_plan_cost=1_000_000)
        window = _raw(
            "SELECT rank() OVER (ORDER BY a.x, b.y) AS r FROM generate_series(1, $1::int) a(x),"
            " generate_series(1, 1000) b(y) LIMIT 1",
            1000,
        )
        await lowered.run(window, offset=0, limit=1, skip_count=True)
        lowered._max_cost = 1.0
        with pytest.raises(ServiceError) as err:
            await lowered.run(window, offset=0, limit=1, skip_count=True)
        assert err.value.code == "query_too_expensive"
    finally:
        await pool.close()


def test_qe06_the_estimate_key_holds_no_bound_value() -> None:
    from query_gateway.sql.estimates import EstimateCache, estimate_key

    key = estimate_key("SELECT $1", ["did:web:alice.example"])
    assert b"alice" not in key and len(key) == 20
    assert key != estimate_key("SELECT $1", ["did:web:bob.example"])
    assert estimate_key("SELECT $1", ["1"]) != estimate_key("SELECT $1", [1])
    cache = EstimateCache(ttl_s=0.0)
    cache.put(key, 5.0)
    assert cache.get(key) is None  # expired at once: asked again
    bounded = EstimateCache(max_entries=2)
    for i in range(3):
        bounded.put(estimate_key("SELECT $1", [i]), float(i))
    assert len(bounded) == 2 and bounded.get(estimate_key("SELECT $1", [0])) is None


async def test_qe10_a_consumer_past_its_share_is_refused_and_others_are_not() -> None:
    slots = ConsumerSlots(2)
    release = asyncio.Event()
    entered: list[str] = []

    async def statement(who: str) -> str:
        async with slots.hold(who):
            entered.append(who)
            await release.wait()
        return who

    flood = [asyncio.create_task(statement("user\x00a")) for _ in range(2)]
    await asyncio.sleep(0)
    with pytest.raises(ServiceError) as err:
        async with slots.hold("user\x00a"):
            pass
    assert (err.value.status_code, err.value.code) == (429, "too_many_concurrent_queries")
    assert err.value.headers == {"Retry-After": "1"}
    other = asyncio.create_task(statement("user\x00b"))  # another consumer is let in
    await asyncio.sleep(0)
    assert entered.count("user\x00b") == 1
    release.set()
    await asyncio.gather(*flood, other)
    assert slots.running("user\x00a") == 0
    async with slots.hold("user\x00a"):  # its slots came back
        assert slots.running("user\x00a") == 1


def test_gs14_a_client_whose_id_equals_a_users_sub_has_buckets_of_its_own() -> None:
    """Issue 34: a client-credentials token (no `sub`) whose `azp` equals a user's `sub` must not
    take from that user's bucket or share: the kind is part of the key."""

    def caller(sub: str | None, client_id: str) -> Caller:
        return Caller(
            sub=sub,
            username=None,
            email=None,
            client_id=client_id,
            roles=frozenset(),
            scopes=frozenset(),
            service_account=sub is None,
            orgs=(),
            exp=None,
            token="t",
        )

    user, client = caller("alice", "portal"), caller(None, "alice")
    assert caller_identity(user) == ("user", "alice")
    assert caller_identity(client) == ("client", "alice")
    assert caller_key(user) != caller_key(client)


def test_qe10_share_keys_carry_the_identity_kind() -> None:
    assert consumer_key("user", "x") != consumer_key("client", "x") != consumer_key("did", "x")
    assert caller_key(None) == consumer_key("user", None)
