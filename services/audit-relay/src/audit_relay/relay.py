"""The consumer: one group, manual commits, one ordered worker per assigned partition.

Flow per partition: the poll loop hands a batch to the partition's worker and pauses the
partition; the worker delivers record after record (retrying the same record, never skipping
ahead), commits, and resumes the partition. A partition waiting out a backoff is therefore paused
while the loop keeps polling the others, so the group never rebalances for a slow ds. An offset is
committed only once ds accepted the record or the DLQ holds it (acks=all, awaited)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.errors import KafkaError
from opentelemetry import trace

from audit_relay.delivery import Accepted, DsSender, Refused, Retry, backoff_delay
from audit_relay.health import Health
from audit_relay.metrics import Metrics
from audit_relay.records import Rejected, audit_body, dead_letter, parse_event
from audit_relay.settings import Settings
from dataplane_contracts.events import DisclosureRecorded
from dataplane_contracts.settings import ConnectorNotConfigured, UnroutableProvider, connector_base
from dataplane_service_kit.logs import get_logger
from dataplane_service_kit.telemetry import context_from_kafka_headers

log = get_logger(__name__)
_tracer = trace.get_tracer("audit_relay")


class Record(Protocol):
    """The parts of an aiokafka ConsumerRecord the relay reads (aiokafka ships no type hints)."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes]]


class PartitionWorker:
    """Delivers one partition's records in order."""

    def __init__(self, relay: Relay, tp: TopicPartition) -> None:
        self.relay = relay
        self.tp = tp
        self.pending: deque[Record] = deque()
        self.done_offset: int | None = None  # next offset to commit
        # the connector the record in hand is being delivered to; set while it is retried, so a
        # revoked partition tells which connector's health state only it was keeping alive
        self.connector: str | None = None
        self.committed_offset: int | None = None
        self._wake = asyncio.Event()
        self._dirty = asyncio.Event()
        self._commit_lock = asyncio.Lock()
        self._failures = 0
        name = f"audit-relay-{tp.topic}-{tp.partition}"
        self.task = asyncio.create_task(self._run(), name=name)
        self._committer = asyncio.create_task(self._commit_loop(), name=f"{name}-commit")

    def feed(self, records: Iterable[Record]) -> None:
        self.pending.extend(records)
        self._wake.set()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self.pending:
                record = self.pending[0]
                if not await self._handle(record):
                    continue  # the same record again: never skip ahead
                self.pending.popleft()
                self.done_offset = record.offset + 1
                self._dirty.set()
            self.relay.resume(self.tp)

    async def _handle(self, record: Record) -> bool:
        """True once the record is done. An unexpected error (a bug) must neither kill the
        partition silently nor skip the record: it is logged and the record retried."""
        try:
            await self.relay.handle(record, self)
        except Exception as exc:
            self._failures += 1
            log.error("handle_failed", partition=self.tp.partition, offset=record.offset, exc_info=exc)
            await self.relay.wait_retry(Retry("internal"), self._failures - 1, self, "")
            return False
        self._failures = 0
        return True

    async def _commit_loop(self) -> None:
        """Commit the newest finished offset in the background, so delivery does not wait for the
        broker and a crash redelivers at most the records finished since the last commit."""
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            await self.commit()

    async def commit(self) -> None:
        # one commit at a time per partition, so a slower older commit never lands after a newer one
        async with self._commit_lock:
            offset = self.done_offset
            if offset is None or offset == self.committed_offset:
                return
            try:
                await self.relay.consumer.commit({self.tp: offset})
            except KafkaError as exc:  # a later commit covers it; the records stay at least once
                log.warning("commit_failed", partition=self.tp.partition, error=type(exc).__name__)
                return
            self.committed_offset = offset

    async def stop(self) -> None:
        """Stop delivering, then commit what is finished."""
        for task in (self.task, self._committer):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.commit()


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, relay: Relay) -> None:
        self.relay = relay

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        await self.relay.drop_workers(revoked)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        log.info("partitions_assigned", partitions=sorted(tp.partition for tp in assigned))
        self.relay.settle_health(assigned)


class Relay:
    def __init__(
        self,
        *,
        settings: Settings,
        consumer: AIOKafkaConsumer,
        producer: AIOKafkaProducer,
        sender: DsSender,
        health: Health,
        metrics: Metrics,
    ) -> None:
        self.settings = settings
        self.consumer = consumer
        self.producer = producer
        self.sender = sender
        self.health = health
        self.metrics = metrics
        self.workers: dict[TopicPartition, PartitionWorker] = {}
        # partition → connector its worker was delivering to when the partition was revoked; read
        # once the new assignment is known (settle_health)
        self._interrupted: dict[TopicPartition, str] = {}
        self._stopping = False

    # -- the poll loop --------------------------------------------------------------------------
    async def run(self) -> None:
        await self._start_clients()
        self.health.consuming = True
        monitor = asyncio.create_task(self._monitor(), name="audit-relay-monitor")
        try:
            while not self._stopping:
                try:
                    batches = await self.consumer.getmany(timeout_ms=200)
                except KafkaError as exc:
                    log.warning("poll_failed", error=type(exc).__name__)
                    await asyncio.sleep(1.0)
                    continue
                for tp, records in batches.items():
                    if not records:
                        continue
                    worker = self.workers.get(tp)
                    if worker is None:
                        worker = self.workers[tp] = PartitionWorker(self, tp)
                    self._pause(tp)
                    worker.feed(records)
        finally:
            monitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await monitor

    async def _start_clients(self) -> None:
        """Connect both clients, retrying while the broker is unreachable (readiness says so)."""
        delay = self.settings.audit_relay_backoff_initial_s
        producer_started = False
        self.consumer.subscribe([self.settings.audit_relay_topic], listener=_Rebalance(self))
        while True:
            try:
                if not producer_started:
                    await self.producer.start()
                    producer_started = True
                await self.consumer.start()
                self.health.broker_ok()
                return
            except KafkaError as exc:  # bootstrap failed before anything was started
                log.warning("broker_unreachable", error=type(exc).__name__)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.settings.audit_relay_backoff_max_s)

    async def stop(self) -> None:
        self._stopping = True
        await self.drop_workers(list(self.workers))

    def _pause(self, tp: TopicPartition) -> None:
        if tp in self.consumer.assignment():
            self.consumer.pause(tp)

    def resume(self, tp: TopicPartition) -> None:
        if tp in self.consumer.assignment() and self.workers.get(tp) is not None:
            self.consumer.resume(tp)

    async def drop_workers(self, tps: Iterable[TopicPartition]) -> None:
        """Stop the workers of revoked partitions and commit what they finished; whatever was in
        flight is delivered again by the next owner (at least once, same Idempotency-Key)."""
        for tp in list(tps):
            worker = self.workers.pop(tp, None)
            if worker is None:
                continue
            if worker.connector is not None:
                self._interrupted[tp] = worker.connector
            await worker.stop()
            with contextlib.suppress(KeyError):  # no lag was measured for it yet
                self.metrics.consumer_lag.remove(tp.topic, str(tp.partition))

    def settle_health(self, assigned: Iterable[TopicPartition]) -> None:
        """After a rebalance: a connector's failure (unreachable, 401/403) is forgotten once no
        partition left here has work for it. Its failing state is otherwise cleared only by that
        connector answering, which never happens if the record went to another replica, and the
        relay would stay unready for good. A partition assigned again keeps its state: its worker
        resumes the same record and the grace keeps running."""
        kept = set(assigned)
        busy = {c for tp, c in self._interrupted.items() if tp in kept}
        busy |= {w.connector for w in self.workers.values() if w.connector is not None}
        for connector in set(self._interrupted.values()) - busy:
            self.health.forget(connector)
            log.info("connector_forgotten", connector=connector)
        if not busy:
            # nothing here needs the service token now; the next attempt re-checks the issuer
            self.health.credentials_failing = False
        self._interrupted.clear()

    # -- one record ------------------------------------------------------------------------------
    async def handle(self, record: Record, worker: PartitionWorker) -> None:
        ctx: Any = context_from_kafka_headers(record.headers)
        with _tracer.start_as_current_span(
            "audit_relay.consume", context=ctx, kind=trace.SpanKind.CONSUMER
        ) as span:
            span.set_attribute("messaging.destination.name", record.topic)
            span.set_attribute("messaging.destination.partition.id", str(record.partition))
            span.set_attribute("messaging.kafka.offset", record.offset)
            parsed = parse_event(record.value)
            if isinstance(parsed, Rejected):
                await self._dead_letter(record, parsed, worker)
                return
            span.set_attribute("audit_relay.event_id", str(parsed.event_id))
            await self._deliver(record, parsed, worker)

    async def _deliver(self, record: Record, event: DisclosureRecorded, worker: PartitionWorker) -> None:
        event_id = str(event.event_id)
        try:
            connector = connector_base(self.settings, event.provider_participant)
        except UnroutableProvider:
            rejected = Rejected("unroutable", "no connector is configured for the provider", event_id)
            await self._dead_letter(record, rejected, worker)
            return
        except ConnectorNotConfigured:
            rejected = Rejected("ds_not_configured", "CONNECTOR_INTERNAL_URL is not configured", event_id)
            await self._dead_letter(record, rejected, worker)
            return
        body = audit_body(event)
        attempt = 0
        worker.connector = connector
        try:
            while True:
                outcome = await self.sender.post(connector, event_id, body)
                if isinstance(outcome, Accepted):
                    self.metrics.delivered.inc()
                    self.metrics.delivery_latency.observe(max(0.0, time.time() - record.timestamp / 1000))
                    return
                if isinstance(outcome, Refused):
                    rejected = Rejected("ds_rejected", f"ds answered {outcome.status}", event_id)
                    await self._dead_letter(record, rejected, worker, ds_status=outcome.status)
                    return
                await self.wait_retry(outcome, attempt, worker, event_id)
                attempt += 1
        finally:
            worker.connector = None

    async def wait_retry(self, outcome: Retry, attempt: int, worker: PartitionWorker, event_id: str) -> None:
        self.metrics.retried.labels(outcome.cause).inc()
        s = self.settings
        delay = backoff_delay(
            attempt,
            initial_s=s.audit_relay_backoff_initial_s,
            max_s=s.audit_relay_backoff_max_s,
            retry_after_s=outcome.retry_after_s,
            retry_after_max_s=s.audit_relay_retry_after_max_s,
        )
        log.warning(
            "delivery_retry",
            event_id=event_id,
            partition=worker.tp.partition,
            cause=outcome.cause,
            attempt=attempt + 1,
            delay_s=round(delay, 3),
        )
        # what is done is made durable before waiting, so a crash during a long outage
        # redelivers only the record being retried
        await worker.commit()
        await asyncio.sleep(delay)

    async def _dead_letter(
        self, record: Record, rejected: Rejected, worker: PartitionWorker, ds_status: int | None = None
    ) -> None:
        value = dead_letter(
            rejected,
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            key=record.key,
            value=record.value,
            ds_status=ds_status,
        )
        headers = [*(record.headers or ()), ("dlq-reason", rejected.reason.encode())]
        attempt = 0
        while True:
            try:
                await self.producer.send_and_wait(
                    self.settings.audit_relay_dlq_topic, value, key=record.key, headers=headers
                )
                break
            except KafkaError as exc:
                log.warning("dead_letter_write_failed", error=type(exc).__name__)
                await self.wait_retry(Retry("dlq_write"), attempt, worker, rejected.event_id or "")
                attempt += 1
        self.metrics.dead_lettered.labels(rejected.reason).inc()
        log.warning(
            "dead_lettered",
            reason=rejected.reason,
            detail=rejected.detail,
            event_id=rejected.event_id,
            partition=record.partition,
            offset=record.offset,
        )

    # -- broker probe and lag ----------------------------------------------------------------------
    async def _monitor(self) -> None:
        interval = self.settings.audit_relay_monitor_interval_s
        while True:
            try:
                await asyncio.wait_for(self._probe(), timeout=max(interval, 5.0))
                self.health.broker_ok()
            except (KafkaError, TimeoutError) as exc:
                log.warning("broker_probe_failed", error=type(exc).__name__)
            await asyncio.sleep(interval)

    async def _probe(self) -> None:
        assigned = sorted(self.consumer.assignment())
        if not assigned:
            await self.consumer.topics()
            return
        ends = await self.consumer.end_offsets(assigned)
        for tp in assigned:
            worker = self.workers.get(tp)
            committed = worker.committed_offset if worker is not None else None
            if committed is None:
                committed = await self.consumer.committed(tp)
            if committed is None:
                committed = (await self.consumer.beginning_offsets([tp]))[tp]
            lag = max(0, ends[tp] - committed)
            self.metrics.consumer_lag.labels(tp.topic, str(tp.partition)).set(lag)
