"""The outbox relay: publishes unsent FlowStateChanged rows to `dataplane.dps.flow-events`,
keyed by flow id, then marks them sent — at least once (a crash between the broker's ack and the
commit re-publishes the same event_id). Replicas share the work through FOR UPDATE SKIP LOCKED;
rows a dead process left unsent are simply still unsent, so whichever relay runs next sends them."""

from __future__ import annotations

import asyncio
import contextlib
import json

from aiokafka import AIOKafkaProducer
from sqlalchemy import exists, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from dataplane_service_kit.logs import get_logger
from signaling import repository
from signaling.metrics import Metrics
from signaling.tables import outbox

log = get_logger(__name__)


class OutboxRelay:
    def __init__(
        self,
        engine: AsyncEngine,
        producer: AIOKafkaProducer,
        poll_interval_s: float = 0.5,
        batch_size: int = 100,
        *,
        metrics: Metrics,
    ) -> None:
        self._engine = engine
        self._producer = producer
        self._metrics = metrics
        self._interval = poll_interval_s
        self._batch = batch_size
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def wake(self) -> None:
        """Called after a transition committed, so its event leaves without waiting for the poll."""
        self._wake.set()

    async def publish_pending(self) -> int:
        """One batch: lock unsent rows (skipping rows another relay holds), publish, mark sent.

        Only the oldest unsent row of each flow is eligible, so two relays never publish one
        flow's events out of order: the topic is compacted by flow id, and its last record per
        key must be the flow's latest state. A later row becomes eligible once the earlier one
        is marked sent (and committed)."""
        earlier = outbox.alias("earlier")
        async with self._engine.begin() as conn:
            rows = (
                await conn.execute(
                    select(outbox.c.id, outbox.c.topic, outbox.c.key, outbox.c.payload, outbox.c.headers)
                    .where(
                        outbox.c.sent_at.is_(None),
                        ~exists().where(
                            earlier.c.key == outbox.c.key,
                            earlier.c.sent_at.is_(None),
                            earlier.c.id < outbox.c.id,
                        ),
                    )
                    .order_by(outbox.c.id)
                    .limit(self._batch)
                    .with_for_update(skip_locked=True, of=outbox)
                )
            ).all()
            if not rows:
                return 0
            futures = [
                await self._producer.send(
                    row.topic,
                    value=json.dumps(row.payload, separators=(",", ":")).encode(),
                    key=row.key.encode(),
                    headers=[(k, v.encode()) for k, v in row.headers],
                )
                for row in rows
            ]
            await asyncio.gather(*futures)  # every record acknowledged (acks=all) before marking
            await conn.execute(
                update(outbox).where(outbox.c.id.in_([r.id for r in rows])).values(sent_at=repository.now())
            )
        self._metrics.events_published.inc(len(rows))
        return len(rows)

    async def run(self) -> None:
        while True:
            self._wake.clear()  # before publishing: a commit during the batch must wake us again
            try:
                while await self.publish_pending() > 0:
                    pass  # a flow's next row becomes eligible once its predecessor is sent
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # keep relaying after a database or broker hiccup
                log.warning("outbox_relay_failed", error=type(exc).__name__)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._interval):
                    await self._wake.wait()

    def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name="outbox-relay")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
