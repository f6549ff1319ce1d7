"""Asynchronous signals, second half: the DPS-12 callbacks a 202 promised, delivered at least once.

An asynchronous prepare or start commits its PREPARING/STARTING flow together with a row of
`dps_callbacks`. Every replica runs this relay. One attempt:

1. one transaction: claim the oldest due row (SKIP LOCKED: replicas share the work), push its next
   attempt ahead by the longer of its backoff and the longest an attempt can take (the lease: no
   other replica sends it meanwhile, so two addresses of one flow are never in flight at once,
   and a process dying from here on leaves it due again then), lock the flow and let
   FlowService.advance finish the transition and build the message (the data address with its
   new credentials exists only in this process's memory);
2. POST it to the control plane (ControlPlaneClient: the flow's callbackAddress, else the endpoint
   its caller registered);
3. accepted: the row is finished. Refused or unreachable: it stays owed, due again after its
   backoff; the backoff doubles from DPS_CALLBACK_RETRY_FIRST_SECONDS up to
   DPS_CALLBACK_RETRY_MAX_SECONDS.

A row is never given up: at least once means until the control plane takes it (or the flow moves
on, which finishes the row as `dropped`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy.ext.asyncio import AsyncEngine

from dataplane_service_kit.logs import get_logger
from signaling import repository
from signaling.callbacks import CallbackFailed, ControlPlaneClient
from signaling.flows import Advanced, FlowService
from signaling.metrics import Metrics
from signaling.repository import FlowRecord, OwedCallback

log = get_logger(__name__)


@dataclass(frozen=True)
class Claimed:
    owed: OwedCallback
    flow: FlowRecord | None
    advanced: Advanced


class CallbackRelay:
    def __init__(
        self,
        engine: AsyncEngine,
        flows: FlowService,
        control_planes: ControlPlaneClient,
        *,
        first_retry_s: float,
        max_retry_s: float,
        poll_interval_s: float,
        attempt_s: float,
        metrics: Metrics,
        on_commit: Callable[[], None] = lambda: None,
    ) -> None:
        self._engine = engine
        self._flows = flows
        self._control_planes = control_planes
        self._metrics = metrics
        self._first = first_retry_s
        self._max = max_retry_s
        self._interval = poll_interval_s
        self._attempt = attempt_s  # the longest one attempt may take (token fetch and POST)
        self._on_commit = on_commit  # a committed transition has an event for the outbox relay
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def wake(self) -> None:
        """Called after an asynchronous signal committed, so its callback leaves at once."""
        self._wake.set()

    def backoff(self, attempt: int) -> float:
        """Seconds before the attempt after `attempt` (1-based) is due."""
        return float(min(self._max, self._first * 2 ** min(attempt - 1, 30)))

    def _lease(self, attempt: int) -> timedelta:
        return timedelta(seconds=max(self._attempt, self.backoff(attempt)))

    async def _claim(self) -> Claimed | None:
        async with self._engine.begin() as conn:
            owed = await repository.claim_callback(conn, self._lease)
            if owed is None:
                return None
            flow = await repository.lock_flow_by_id(conn, owed.flow_id)
            advanced = Advanced(None, None)
            if flow is not None:  # always, while the foreign key cascades
                advanced = await self._flows.advance(conn, flow, owed.action)
            if advanced.action is None:
                await repository.finish_callback(conn, owed.id, "dropped")
        self._on_commit()
        return Claimed(owed, flow, advanced)

    async def deliver_one(self) -> bool:
        """One due callback attempted; False when none is due."""
        claimed = await self._claim()
        if claimed is None:
            return False
        owed, flow, action = claimed.owed, claimed.flow, claimed.advanced.action
        if action is None or flow is None:
            self._metrics.callbacks.labels(action=owed.action, outcome="dropped").inc()
            log.info("callback_dropped", flow_id=owed.flow_id, action=owed.action)
            return True
        try:
            await self._control_planes.notify(flow, action, claimed.advanced.message)
        except CallbackFailed as exc:
            self._metrics.callbacks.labels(action=action, outcome="failed").inc()
            # the reason names a status or an exception class, never a body or a token
            log.warning(
                "callback_failed",
                flow_id=flow.id,
                action=action,
                attempt=owed.attempts,
                reason=str(exc),
                retry_in_s=self.backoff(owed.attempts),
            )
            async with self._engine.begin() as conn:
                retry_in = timedelta(seconds=self.backoff(owed.attempts))
                await repository.callback_failed(conn, owed.id, str(exc), retry_in)
            return True
        async with self._engine.begin() as conn:
            await repository.finish_callback(conn, owed.id, "delivered")
        self._metrics.callbacks.labels(action=action, outcome="delivered").inc()
        log.info("callback_delivered", flow_id=flow.id, action=action, attempt=owed.attempts)
        return True

    async def _sleep_s(self) -> float:
        """Until the next owed callback is due, at most the poll interval."""
        async with self._engine.connect() as conn:
            due = await repository.next_callback_due(conn)
        if due is None:
            return self._interval
        return max(0.0, min(self._interval, (due - repository.now()).total_seconds()))

    async def run(self) -> None:
        while True:
            self._wake.clear()  # before working: a commit meanwhile must wake us again
            wait = self._interval
            try:
                while await self.deliver_one():
                    pass
                wait = await self._sleep_s()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # keep relaying after a database hiccup
                log.warning("callback_relay_failed", error=type(exc).__name__)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._wake.wait()

    def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name="callback-relay")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
