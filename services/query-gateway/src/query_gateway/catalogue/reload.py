"""The catalogue reloaded on SIGHUP (docs/operations.md, "Reloading the catalogue"): the file is
checked whole (load.py) before anything changes; a file that fails keeps the catalogue
being served and the log line says why. `query_gateway_catalogue_info{digest}` names the file
being served, `query_gateway_catalogue_reloads_total{outcome}` counts the attempts.

Requests in flight finish on the catalogue they started with: a reload swaps the app's `Gateway`
for a copy over the new catalogue, and every cache keyed by the catalogue (validation, rewrite)
is keyed by the catalogue object itself."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
from typing import Any

import asyncpg

from dataplane_service_kit.logs import get_logger
from query_gateway.catalogue.early_signals import take_early_reload
from query_gateway.catalogue.load import CatalogueRefused, CheckedCatalogue, check_catalogue
from query_gateway.metrics import Metrics
from query_gateway.state import gateway_of

log = get_logger("query_gateway.catalogue")


def serving(metrics: Metrics, checked: CheckedCatalogue) -> None:
    """The metric names this file alone."""
    metrics.catalogue_info.clear()
    metrics.catalogue_info.labels(digest=checked.digest).set(1)


class CatalogueReloader:
    """Reloads one app's catalogue, one reload at a time; `install` binds SIGHUP to it."""

    def __init__(self, state: Any, pool: asyncpg.Pool, digest: str) -> None:
        self.state = state  # the FastAPI app's state: `gateway` is swapped there
        self.pool = pool
        self.digest = digest
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[bool]] = set()

    async def reload(self) -> bool:
        async with self._lock:
            gw = gateway_of(self.state)
            try:
                checked = await check_catalogue(gw.settings, self.pool)
            except CatalogueRefused as exc:
                gw.metrics.catalogue_reloads.labels(outcome="refused").inc()
                log.error(
                    "catalogue_reload_refused",  # the previous file is still served
                    reason=str(exc),
                    digest=self.digest,
                )
                return False
            self.state.gateway = dataclasses.replace(
                gw,
                catalogue=checked.catalogue,
                columns=checked.columns,
                mask_key=checked.mask_key,
                leakproof=checked.leakproof,
                entries={},  # rebuilt from the new catalogue (Gateway.__post_init__)
            )
            gw.executor.forget_estimates()  # the tables, statistics and bounds may be others now
            self.digest = checked.digest
            serving(gw.metrics, checked)
            gw.metrics.catalogue_reloads.labels(outcome="reloaded").inc()
            log.info("catalogue_reloaded", datasets=len(checked.catalogue.datasets), digest=checked.digest)
            return True

    def _on_signal(self) -> None:
        task = asyncio.get_running_loop().create_task(self.reload())
        self._tasks.add(task)  # held until done: the loop keeps only a weak reference
        task.add_done_callback(self._tasks.discard)

    def install(self) -> bool:
        """SIGHUP reloads; False where a handler cannot be set (not the main thread: an
        in-process test app)."""
        try:
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self._on_signal)
        except (RuntimeError, ValueError, NotImplementedError):
            return False
        return True

    def uninstall(self) -> None:
        with contextlib.suppress(RuntimeError, ValueError, NotImplementedError):
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)


def watch_catalogue(
    state: Any,
    pool: asyncpg.Pool,
    checked: CheckedCatalogue,
    stack: contextlib.ExitStack[Any] | contextlib.AsyncExitStack[Any],
    metrics: Metrics,
) -> CatalogueReloader:
    """The served file named in the metric, and SIGHUP bound to a reload until `stack` closes."""
    reloader = CatalogueReloader(state, pool, checked.digest)
    serving(metrics, checked)
    if reloader.install():
        stack.callback(reloader.uninstall)
        if take_early_reload():  # asked while starting: the file may have changed since it was read
            log.info("catalogue_reload_asked_while_starting", digest=checked.digest)
            reloader._on_signal()
    return reloader
