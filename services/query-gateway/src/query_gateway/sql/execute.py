"""Read-only execution with pagination (QE-04), limits and error mapping (docs/gateway.md)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import asyncpg

from dataplane_service_kit.errors import ServiceError
from dataplane_service_kit.logs import get_logger
from query_gateway.sql.cost_calibration import cost_per_ms, plan_cost
from query_gateway.sql.estimates import EstimateCache, estimate_key
from query_gateway.sql.model import DEFAULT_LIMIT, MAX_LIMIT, NarrowedQuery, QueryPage
from query_gateway.sql.pagination import PageQueries, page_and_count
from query_gateway.sql.rows import page_items

log = get_logger(__name__)

_CONNECTION_LOST: tuple[type[BaseException], ...] = (
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.AdminShutdownError,
    asyncpg.exceptions.CannotConnectNowError,
    asyncpg.exceptions.CrashShutdownError,
    asyncpg.exceptions.TooManyConnectionsError,
    ConnectionError,
    OSError,
    TimeoutError,  # our bounds: the acquire, the command and the request's whole database time
    # raised when a connection the server killed is released back to the pool (the holder was
    # already freed by the connection's close): the database went away mid-request
    asyncpg.InternalClientError,
)

# the gateway's bounds when a caller names none (settings: DATABASE_ACQUIRE_TIMEOUT_MS, and
# DATABASE_COMMAND_TIMEOUT_MS, by default the statement timeout plus this margin)
DEFAULT_ACQUIRE_TIMEOUT_S = 2.0
COMMAND_MARGIN_S = 2.0

# What one datasets session may take of the server beside time (QE-09, and docs/operations.md,
# "Bounding a statement's memory"): a sort or hash spills to disk past work_mem instead of growing, no
# parallel workers multiply it, and the temporary files it spills are bounded by the reader
# role's temp_file_limit (a superuser-only setting, so the set-up that creates the role sets it;
# a session cannot). No PostgreSQL setting bounds the memory of one expression's value: that is
# the growth budget's job (sql/growth.py), before the statement is sent.
SESSION_BOUNDS: dict[str, str] = {
    "work_mem": "16MB",
    "hash_mem_multiplier": "1",
    "max_parallel_workers_per_gather": "0",
}
# what the role set-up gives the reader (ALTER ROLE ... SET temp_file_limit)
READER_TEMP_FILE_LIMIT = "256MB"

# SQLSTATEs of a statement that ran into a resource bound: the caller's statement is too big for
# its share, a 400 to change the statement, never a 503 "retry" (retrying fails the same way)
_RESOURCES_EXCEEDED = frozenset(
    {
        "53000",  # insufficient_resources
        "53100",  # disk_full
        "53200",  # out_of_memory
        "53400",  # configuration_limit_exceeded: temp_file_limit
        "54000",  # program_limit_exceeded: a value past PostgreSQL's 1 GB
        "54001",  # statement_too_complex
    }
)


def check_text(sql: str) -> None:
    """Refuses text PostgreSQL cannot take, before it is parsed, logged or sent: a NUL ends a
    string of the wire protocol (the server would read the rest as another message and drop the
    connection), and a lone surrogate is not UTF-8 at all. The detail never quotes the text."""
    if "\x00" in sql:
        raise ServiceError("invalid_text", "sql query holds a NUL character, which PostgreSQL cannot take")
    if not sql.isascii():
        try:
            sql.encode("utf-8")
        except UnicodeEncodeError:
            raise ServiceError("invalid_text", "sql query holds a lone surrogate: it is not text") from None


def clamp_page(offset: int, limit: int, max_limit: int = MAX_LIMIT) -> tuple[int, int]:
    """QE-01: limit ≤ 0 → the default, above the cap → the cap; a negative offset → 0."""
    applied = DEFAULT_LIMIT if limit <= 0 else min(limit, max_limit)
    return max(0, offset), min(applied, max_limit)


async def _rollback(conn: asyncpg.pool.PoolConnectionProxy) -> None:
    """End the failed transaction; when that fails too, the pool's reset on release rolls back or
    terminates the connection, so the original error is the one reported."""
    with contextlib.suppress(Exception):
        # bounded: after the request's own bound fired, nothing else cancels this wait
        await conn.execute("ROLLBACK", timeout=DEFAULT_ACQUIRE_TIMEOUT_S)


QUERY_FAILED = "Database query failed"


def _lost() -> ServiceError:
    return ServiceError("database_unavailable", "Database connection lost, retry the query")


def _busy() -> ServiceError:
    return ServiceError(
        "database_busy",
        "every database connection stayed in use past the wait bound; retry the query",
        headers={"Retry-After": "1"},
    )


def _pool_full(pool: asyncpg.Pool) -> bool:
    """A wait for a connection that timed out because all of them were lent out, rather than
    because a new one could not be opened (the database gone)."""
    return bool(pool.get_size() >= pool.get_max_size() and pool.get_idle_size() == 0)


async def rolled_back_only(conn: asyncpg.Connection) -> None:
    """The pool's reset on release: asyncpg rolls back an open transaction before calling this,
    and nothing more is needed — a verified statement (and the pull-grant read) is one SELECT of
    allowlisted functions, so it can leave no session state (no SET, LISTEN, cursor, advisory
    lock or temporary table). The default reset (`RESET ALL` and more) would be a second round
    trip on every request."""


async def datasets_pool(
    url: str,
    *,
    statement_timeout_ms: int,
    max_size: int,
    command_timeout_s: float | None = None,
    connect_timeout_s: float = DEFAULT_ACQUIRE_TIMEOUT_S,
) -> asyncpg.Pool:
    """A pool whose sessions are read-only and carry the statement timeout from their start, so
    a request needs no BEGIN, SET LOCAL or COMMIT: `QueryExecutor(..., session_defaults=True)`.
    A caller cannot change either (it can send no SET), and RESET returns to them.

    The client-side bounds hold when the server cannot enforce its own (stopped, partitioned):
    `command_timeout_s` on every statement (above the statement timeout, so a running server's
    400 query_timeout comes first) and `connect_timeout_s` on opening a connection."""
    command = (
        command_timeout_s if command_timeout_s is not None else statement_timeout_ms / 1000 + COMMAND_MARGIN_S
    )
    pool: asyncpg.Pool = await asyncpg.create_pool(
        url,
        min_size=1,
        max_size=max_size,
        command_timeout=command,
        timeout=connect_timeout_s,
        server_settings={
            "default_transaction_read_only": "on",
            "statement_timeout": str(int(statement_timeout_ms)),
            **SESSION_BOUNDS,
        },
        reset=rolled_back_only,
    )
    return pool


class QueryExecutor:
    """Runs a narrowed statement's page, read-only, within the statement timeout.

    Over a `datasets_pool` (`session_defaults=True`, the same timeout) the common request is ONE
    statement and one round trip: the page with the total beside each row (`count(*) OVER ()`
    counts before LIMIT, in the same scan and snapshot). A page past the end has no row to carry
    the total; it, and any request over another pool, runs count and page in one REPEATABLE READ
    READ ONLY transaction with SET LOCAL statement_timeout."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        statement_timeout_ms: int,
        max_limit: int = MAX_LIMIT,
        *,
        session_defaults: bool = False,
        acquire_timeout_s: float = DEFAULT_ACQUIRE_TIMEOUT_S,
        command_timeout_s: float | None = None,
        max_plan_cost: float = 0,
    ) -> None:
        self._pool = pool
        # QE-06: 0 asks for no estimate (no round trip added)
        self._max_cost = max_plan_cost
        self._estimates = EstimateCache()
        self._timeout_ms = int(statement_timeout_ms)
        self._acquire_s = acquire_timeout_s
        command = (
            command_timeout_s if command_timeout_s is not None else self._timeout_ms / 1000 + COMMAND_MARGIN_S
        )
        # a request's whole time on the database: a connection, then at most one command's
        # bound (the rare count-and-page transaction shares it); past it the request is answered
        # 503 database_unavailable while the pool finishes with the connection in the background
        self.bound_s = acquire_timeout_s + command
        self._max_limit = max_limit
        self._one_statement = session_defaults
        self._begin = (
            "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; "
            f"SET LOCAL statement_timeout = {self._timeout_ms}"
        )

    async def run(
        self, q: NarrowedQuery, *, offset: int, limit: int, skip_count: bool, max_rows: int | None = None
    ) -> QueryPage:
        """`max_rows`: the touched datasets' own cap (QE-07), applied as the global one is."""
        check_text(q.sql)  # the gateway refused such a statement already; this executor never sends one
        cap = self._max_limit if max_rows is None else min(self._max_limit, max_rows)
        offset, limit = clamp_page(offset, limit, cap)
        sqls = page_and_count(q.sql, len(q.params), q.denied, q.order_by)
        args = (*q.params, limit, offset)
        total: int | None = None
        counted = False  # whether the rows carry the total as their last column
        acquired = False
        try:
            async with asyncio.timeout(self.bound_s), self._pool.acquire(timeout=self._acquire_s) as conn:
                acquired = True
                if not self._one_statement:
                    total, rows = await self._in_transaction(conn, sqls, q, args, skip_count, guard=True)
                else:
                    await self._guard(conn, q)  # in the session's read-only default, before any row
                    if skip_count:
                        rows = await conn.fetch(sqls.page, *args)
                    else:
                        rows = await conn.fetch(sqls.counted_page, *args)
                        counted = bool(rows)
                        if rows:
                            total = int(rows[0][-1])
                        elif offset == 0:
                            total = 0
                        else:
                            total, rows = await self._in_transaction(conn, sqls, q, args, False)
        except ServiceError:
            raise  # the cost guard's refusal (QE-06), as it is
        except Exception as err:
            raise self._mapped(err, waiting=not acquired) from None
        # a counted page's last column is the total (_dp_total), not the caller's
        items = page_items(rows, drop_last=counted)
        return QueryPage(items=items, offset=offset, limit=limit, count=len(items), total=total)

    def _mapped(self, err: Exception, *, waiting: bool) -> ServiceError:
        """A driver's or server's failure as the coded refusal the caller gets. `waiting`: it
        came while no connection had been lent yet."""
        if isinstance(err, TimeoutError):
            if waiting and _pool_full(self._pool):
                log.warning("query_database_busy")
                return _busy()
            log.warning("query_database_unavailable", error="TimeoutError")
            return _lost()
        if isinstance(err, asyncpg.QueryCanceledError):
            if "statement timeout" in str(err):
                return ServiceError("query_timeout", "Query exceeded time limit")
            return self._failed(err)
        if isinstance(err, _CONNECTION_LOST):
            log.warning("query_database_unavailable", error=type(err).__name__)
            return _lost()
        if isinstance(err, asyncpg.InterfaceError):
            if isinstance(err, ValueError):  # the driver refused a value: the request's failure
                return self._failed(err)
            # the driver's state ("connection is closed", "… was released", "another operation
            # is in progress"): nothing the statement did; the database is not usable now
            log.warning("query_database_unavailable", error=type(err).__name__)
            return _lost()
        if isinstance(err, asyncpg.PostgresError):
            # the statement failed inside PostgreSQL with an SQL error: the request's failure
            return self._failed(err)
        if isinstance(err, UnicodeError):
            # a value the driver could not encode: the request's text, never a lost connection
            log.warning("query_failed", error="UnicodeError")
            return ServiceError("invalid_text", "the query holds text PostgreSQL cannot take")
        # any other driver failure: coded and bounded, never a bare 500, and never rows
        log.error("query_database_unavailable", error=type(err).__name__)
        return _lost()

    @property
    def max_plan_cost(self) -> float:
        """The estimate above which a statement is refused (0: no estimate asked)."""
        return self._max_cost

    def forget_estimates(self) -> None:
        """QE-06: every kept estimate is asked again (the catalogue was reloaded)."""
        self._estimates.clear()

    async def calibrate(self) -> float:
        """QE-06: the database's cost units per millisecond, measured now; from then on an
        estimate that would need more than the statement timeout at that pace is refused (or
        above QUERY_MAX_PLAN_COST, where that is lower). Returns the figure."""
        per_ms = await cost_per_ms(self._pool)
        budget = per_ms * self._timeout_ms
        self._max_cost = min(self._max_cost, budget) if self._max_cost else budget
        return per_ms

    async def _guard(self, conn: Any, q: NarrowedQuery) -> None:
        """QE-06: PostgreSQL's estimate of the narrowed statement (EXPLAIN, never ANALYZE: nothing
        runs), refused above QUERY_MAX_PLAN_COST. The largest estimate of any node, not the root's:
        a LIMIT hides the cost of what it must read first (a sort, a window over every row)."""
        if not self._max_cost:
            return
        key = estimate_key(q.sql, q.params)
        cost = self._estimates.get(key)
        if cost is None:
            cost = plan_cost(await conn.fetchval(f"EXPLAIN (FORMAT JSON) {q.sql}", *q.params))
            self._estimates.put(key, cost)
        if cost > self._max_cost:
            # the estimate alone: the plan's text names tables, indexes and bound values
            log.info("query_too_expensive", cost=round(cost))
            raise ServiceError(
                "query_too_expensive",
                f"the query's estimated cost {cost:.0f} is above the limit {self._max_cost:.0f}",
            )

    async def _in_transaction(
        self,
        conn: Any,
        sqls: PageQueries,
        q: NarrowedQuery,
        args: tuple[object, ...],
        skip_count: bool,
        *,
        guard: bool = False,
    ) -> tuple[int | None, list[asyncpg.Record]]:
        """Count and page in one snapshot, read-only; the timeout dies with the transaction.
        BEGIN and SET LOCAL travel as one simple query: one round trip, not two. `guard`: the
        cost guard first, inside the transaction (the fast path ran it already otherwise)."""
        total: int | None = None
        try:
            await conn.execute(self._begin)
            if guard:
                await self._guard(conn, q)
            if not skip_count:
                total = int(await conn.fetchval(sqls.count, *q.params))
            rows: list[asyncpg.Record] = await conn.fetch(sqls.page, *args)
        except BaseException:
            await _rollback(conn)
            raise
        await conn.execute("COMMIT")
        return total, rows

    @staticmethod
    def _failed(err: Exception) -> ServiceError:
        # the driver's message may quote a value (a bound key among them): the log line keeps the
        # class and the SQLSTATE, which name no value; the answer names neither, so a caller
        # cannot tell one failure from another (an error oracle on the rows it may not read)
        sqlstate = getattr(err, "sqlstate", None) or "?"
        if sqlstate in _RESOURCES_EXCEEDED:
            log.warning("query_resources_exceeded", error=type(err).__name__, sqlstate=sqlstate)
            return ServiceError(
                "query_resources_exceeded",
                "the query needs more memory or temporary space than one query may use",
            )
        log.warning("query_failed", error=type(err).__name__, sqlstate=sqlstate)
        return ServiceError("query_failed", QUERY_FAILED)
