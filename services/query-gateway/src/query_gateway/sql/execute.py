"""Read-only execution with pagination (QE-04), limits and error mapping (reference §4.5)."""

from __future__ import annotations

import contextlib
import datetime as dt
import uuid
from decimal import Decimal

import asyncpg

from dataplane_service_kit.errors import ServiceError
from dataplane_service_kit.logs import get_logger
from query_gateway.sql.model import DEFAULT_LIMIT, MAX_LIMIT, NarrowedQuery, QueryPage
from query_gateway.sql.pagination import page_and_count

log = get_logger(__name__)

_CONNECTION_LOST: tuple[type[BaseException], ...] = (
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.AdminShutdownError,
    asyncpg.exceptions.CannotConnectNowError,
    asyncpg.exceptions.CrashShutdownError,
    asyncpg.exceptions.TooManyConnectionsError,
    ConnectionError,
    OSError,
    TimeoutError,
)


# exact types a row value most often has, and what JSON carries for each: one dict look-up
# instead of the isinstance chain below (which still decides any other type, subclasses included)
_AS_IS: frozenset[type] = frozenset({type(None), bool, int, float, str})
_ISO: frozenset[type] = frozenset({dt.datetime, dt.date, dt.time})
_PLAIN = (bool, int, float, str)
_TEMPORAL = (dt.datetime, dt.date, dt.time)
_SEQUENCES = (list, tuple)
_BYTES = (bytes, bytearray, memoryview)


def jsonable(value: object) -> object:
    """A row value as JSON can carry it (FastAPI's rules: integral Decimal → int, else float)."""
    kind = type(value)
    if kind in _AS_IS:
        return value
    if kind in _ISO:
        return value.isoformat()  # type: ignore[attr-defined]
    if value is None or isinstance(value, _PLAIN):
        return value
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() and value.is_finite() else float(value)
    if isinstance(value, _TEMPORAL):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, _SEQUENCES):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, _BYTES):
        return bytes(value).hex()
    return str(value)


def clamp_page(offset: int, limit: int, max_limit: int = MAX_LIMIT) -> tuple[int, int]:
    """§4.1: limit ≤ 0 → the default, above the cap → the cap; a negative offset → 0."""
    applied = DEFAULT_LIMIT if limit <= 0 else min(limit, max_limit)
    return max(0, offset), min(applied, max_limit)


async def _rollback(conn: asyncpg.pool.PoolConnectionProxy) -> None:
    """End the failed transaction; when that fails too, the pool's reset on release rolls back or
    terminates the connection, so the original error is the one reported."""
    with contextlib.suppress(Exception):
        await conn.execute("ROLLBACK")


def _lost() -> ServiceError:
    return ServiceError("database_unavailable", "Database connection lost, retry the query")


class QueryExecutor:
    def __init__(self, pool: asyncpg.Pool, statement_timeout_ms: int, max_limit: int = MAX_LIMIT) -> None:
        self._pool = pool
        self._timeout_ms = int(statement_timeout_ms)
        self._max_limit = max_limit
        self._begin = (
            "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; "
            f"SET LOCAL statement_timeout = {self._timeout_ms}"
        )

    async def run(self, q: NarrowedQuery, *, offset: int, limit: int, skip_count: bool) -> QueryPage:
        offset, limit = clamp_page(offset, limit, self._max_limit)
        page_sql, count_sql = page_and_count(q.sql, len(q.params), q.denied)
        total: int | None = None
        try:
            async with self._pool.acquire() as conn:
                # one snapshot for count and page, read-only; the timeout dies with the transaction.
                # BEGIN and SET LOCAL travel as one simple query: one round trip, not two
                try:
                    await conn.execute(self._begin)
                    if not skip_count:
                        total = int(await conn.fetchval(count_sql, *q.params))
                    rows = await conn.fetch(page_sql, *q.params, limit, offset)
                except BaseException:
                    await _rollback(conn)
                    raise
                await conn.execute("COMMIT")
        except asyncpg.QueryCanceledError as err:
            if "statement timeout" in str(err):
                raise ServiceError("query_timeout", "Query exceeded time limit") from None
            raise self._failed(err) from None
        except _CONNECTION_LOST as err:
            log.warning("query_database_unavailable", error=type(err).__name__)
            raise _lost() from None
        except asyncpg.InterfaceError as err:
            if "connection" in str(err).lower():  # "connection is closed", "… was released"
                raise ServiceError(
                    "database_unavailable", "Database connection lost, retry the query"
                ) from None
            raise self._failed(err) from None
        except asyncpg.PostgresError as err:
            raise self._failed(err) from None
        items = [{k: jsonable(v) for k, v in r.items()} for r in rows]
        return QueryPage(items=items, offset=offset, limit=limit, count=len(items), total=total)

    @staticmethod
    def _failed(err: Exception) -> ServiceError:
        # the driver's message may quote a value (a bound key among them): log the class only
        sqlstate = getattr(err, "sqlstate", None) or "?"
        log.warning("query_failed", error=type(err).__name__, sqlstate=sqlstate)
        return ServiceError(
            "query_failed", f"Database query failed ({type(err).__name__}, SQLSTATE {sqlstate})"
        )
