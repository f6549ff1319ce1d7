"""The change watchers behind the long poll (docs/records.md, "Waiting for changes"): one per
dataset's change column and replica, running only while some request waits on it. Each tick is
one short query on a pooled connection (the highest change below the horizon); every waiter
whose position it reached is woken. A waiting request holds no connection and costs no query of
its own; what it then delivers is read — and every check made again — by the request itself."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

import asyncpg

from dataplane_service_kit.logs import get_logger
from query_gateway.sql import watch_statement

log = get_logger(__name__)

TICK_S = 0.2  # the watcher's pace: the added latency of a delivery, at most
QUERY_TIMEOUT_S = 2.0


@dataclass
class _Watch:
    statement: str
    waiters: list[tuple[int, asyncio.Future[bool]]] = field(default_factory=list)
    task: asyncio.Task[None] | None = None


class ChangeWatchers:
    def __init__(self, pool: asyncpg.Pool, tick_s: float = TICK_S) -> None:
        self._pool = pool
        self._tick_s = tick_s
        self._watches: dict[tuple[str, str], _Watch] = {}
        self._closing = False
        self._closed = asyncio.Event()

    @property
    def watching(self) -> int:
        """How many watchers run now (one per change column somebody waits on)."""
        return sum(1 for w in self._watches.values() if w.task is not None)

    async def wait(self, table: str, column: str, since: int | None, timeout_s: float) -> bool:
        """True once a change at or above `since` is below the horizon; False at the timeout or
        on shutdown. `since` None: nothing to watch for, only the time passes."""
        if self._closing or timeout_s <= 0:
            return False
        if since is None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await self._closed.wait()
            return False
        watch = self._watches.setdefault((table, column), _Watch(watch_statement(table, column)))
        woken: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        entry = (since, woken)
        watch.waiters.append(entry)
        if watch.task is None:
            watch.task = asyncio.create_task(self._run(watch), name=f"change-watch {table}")
        try:
            async with asyncio.timeout(timeout_s):
                return await woken
        except TimeoutError:
            return False
        finally:
            if entry in watch.waiters:
                watch.waiters.remove(entry)

    async def _run(self, watch: _Watch) -> None:
        try:
            while watch.waiters and not self._closing:
                reached = await self._highest(watch.statement)
                if reached is not None:
                    for since, woken in list(watch.waiters):
                        if reached >= since and not woken.done():
                            woken.set_result(True)
                await asyncio.sleep(self._tick_s)
        finally:
            watch.task = None

    async def _highest(self, statement: str) -> int | None:
        """The highest change below the horizon; None when the table has none or the database
        did not answer (the waiters then wait out their time and read again, failing closed
        there if the database is gone)."""
        try:
            async with asyncio.timeout(QUERY_TIMEOUT_S), self._pool.acquire() as conn:
                value = await conn.fetchval(statement)
        except (asyncpg.PostgresError, OSError, TimeoutError, asyncpg.InterfaceError) as exc:
            log.warning("records_change_watch_failed", error=type(exc).__name__)
            return None
        return int(value) if value is not None else None

    async def close(self) -> None:
        """Shutdown: every waiter answers now (with what it has), and the watchers stop."""
        self._closing = True
        self._closed.set()
        for watch in self._watches.values():
            for _, woken in watch.waiters:
                if not woken.done():
                    woken.set_result(False)
            if watch.task is not None:
                watch.task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watch.task
        self._watches.clear()
