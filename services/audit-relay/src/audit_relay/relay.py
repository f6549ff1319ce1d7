"""The consumer: one group, manual commits, a worker per assigned partition (partition.py) that
delivers several records at once within a window (window.py).

The poll loop only fetches and feeds; each partition's worker sends what its window allows and
commits the offset after its longest finished prefix, so an offset is committed only once ds
accepted every record before it or the DLQ holds it (acks=all, awaited). A partition waiting out
a backoff, or with its buffer full, is paused or simply not sending while the loop keeps polling
the others, so the group never rebalances for a slow ds."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, cast

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.errors import KafkaError
from opentelemetry import trace
from opentelemetry.context import Context

from audit_relay.delivery import Accepted, DsSender, Refused, Retry, backoff_delay
from audit_relay.health import Health
from audit_relay.metrics import Metrics
from audit_relay.partition import FINISHED, HELD_BACK, Finished, PartitionWorker
from audit_relay.records import Rejected, audit_body, dead_letter, parse_event
from audit_relay.settings import Settings
from audit_relay.window import Record, Slot, Window
from dataplane_service_kit.backoff import Backoff
from dataplane_service_kit.connectors import ConnectorNotConfigured, UnroutableProvider, connector_base
from dataplane_service_kit.logs import get_logger
from dataplane_service_kit.telemetry import context_from_kafka_headers

log = get_logger(__name__)
_tracer = trace.get_tracer("audit_relay")


@dataclass(frozen=True)
class _Post:
    """A record ready to post, worked out once however often it is retried: the body serialised,
    the producer's trace context read from the record's headers."""

    event_id: str
    connector: str
    body: bytes
    trace: Context


def _span_attributes(record: Record, event_id: str | None) -> dict[str, str | int]:
    """What the relay's span of a record says about it (no personal data: places and the id)."""
    attributes: dict[str, str | int] = {
        "messaging.destination.name": record.topic,
        "messaging.destination.partition.id": str(record.partition),
        "messaging.kafka.offset": record.offset,
    }
    if event_id is not None:
        attributes["audit_relay.event_id"] = event_id
    return attributes


@dataclass(frozen=True)
class _Letter:
    """A record to dead-letter (kept, so a failed DLQ write is retried without asking ds again)."""

    rejected: Rejected
    ds_status: int | None = None


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
        # partition → connectors its worker had sent to without an answer that finished the record,
        # when the partition was revoked; read once the new assignment is known (settle_health)
        self._interrupted: dict[TopicPartition, set[str]] = {}
        self._stopping = False

    # -- the poll loop --------------------------------------------------------------------------
    async def run(self) -> None:
        await self._start_clients()
        self.health.consuming = True
        monitor = asyncio.create_task(self._monitor(), name="audit-relay-monitor")
        # one fetch brings at most what one partition may buffer (the rest would be sought back)
        max_records = self.settings.audit_relay_max_buffered_per_partition
        try:
            while not self._stopping:
                try:
                    batches = await self.consumer.getmany(timeout_ms=200, max_records=max_records)
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
                    worker.feed(records)
        finally:
            monitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await monitor

    async def _start_clients(self) -> None:
        """Connect both clients, retrying while the broker is unreachable (readiness says so)."""
        s = self.settings
        backoff = Backoff(s.audit_relay_backoff_initial_s, s.audit_relay_backoff_max_s)
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
                await asyncio.sleep(backoff.next())

    async def stop(self) -> None:
        self._stopping = True
        await self.drop_workers(list(self.workers))

    def pause(self, worker: PartitionWorker) -> None:
        """Stop fetching a partition whose buffer is full (its worker resumes it)."""
        if worker.tp in self.consumer.assignment():
            self.consumer.pause(worker.tp)
            worker.fetch_paused = True

    def resume(self, worker: PartitionWorker) -> None:
        if worker.tp in self.consumer.assignment() and self.workers.get(worker.tp) is worker:
            self.consumer.resume(worker.tp)
        worker.fetch_paused = False

    async def drop_workers(self, tps: Iterable[TopicPartition]) -> None:
        """Stop the workers of revoked partitions and commit what they finished; whatever was in
        flight is delivered again by the next owner (at least once, same Idempotency-Key)."""
        for tp in list(tps):
            worker = self.workers.pop(tp, None)
            if worker is None:
                continue
            connectors = worker.window.connectors()
            if connectors:
                self._interrupted[tp] = connectors
            await worker.stop()
            with contextlib.suppress(KeyError):  # no lag was measured for it yet
                self.metrics.consumer_lag.remove(tp.topic, str(tp.partition))

    def settle_health(self, assigned: Iterable[TopicPartition]) -> None:
        """After a rebalance: a connector's failure (unreachable, 401/403) is forgotten once no
        partition left here has work for it. Its failing state is otherwise cleared only by that
        connector answering, which never happens if the record went to another replica, and the
        relay would stay unready for good. A partition assigned again keeps its state: its worker
        sends the same records again and the grace keeps running."""
        kept = set(assigned)
        busy: set[str] = set()
        for tp, connectors in self._interrupted.items():
            if tp in kept:
                busy |= connectors
        for worker in self.workers.values():
            busy |= worker.window.connectors()
        interrupted = set().union(*self._interrupted.values()) if self._interrupted else set()
        for connector in interrupted - busy:
            self.health.forget(connector)
            log.info("connector_forgotten", connector=connector)
        if not busy:
            # nothing here needs the service token now; the next attempt re-checks the issuer
            self.health.credentials_failing = False
        self._interrupted.clear()

    # -- one attempt at one record ------------------------------------------------------------------
    async def deliver(self, slot: Slot, window: Window) -> Finished | Retry:
        if slot.prepared is None:
            slot.prepared = self._prepare(slot.record)
        prepared = slot.prepared
        if isinstance(prepared, _Letter):
            return await self._dead_letter(slot, prepared)
        assert isinstance(prepared, _Post)
        async with self.sender.gate(prepared.connector):
            # a record of this partition failed while this one waited for the connector: only
            # the probe may go now (window.py, "Retry, head first")
            if not window.may_post(slot, time.monotonic()):
                return HELD_BACK
            slot.connector = prepared.connector
            self.metrics.in_flight.inc()
            try:
                outcome = await self.sender.post(
                    prepared.connector,
                    prepared.event_id,
                    prepared.body,
                    parent=prepared.trace,
                    attributes=_span_attributes(slot.record, prepared.event_id),
                )
            finally:
                self.metrics.in_flight.dec()
        if isinstance(outcome, Accepted):
            self.metrics.delivered.inc()
            self.metrics.outcome("delivered")
            self.metrics.delivery_latency.observe(max(0.0, time.time() - slot.record.timestamp / 1000))
            return FINISHED
        if isinstance(outcome, Refused):
            rejected = Rejected("ds_rejected", f"ds answered {outcome.status}", prepared.event_id)
            slot.prepared = _Letter(rejected, outcome.status)
            return await self._dead_letter(slot, slot.prepared)
        return outcome

    def _prepare(self, record: Record) -> _Post | _Letter:
        """The event, its connector, its body and its trace; or why it goes to the DLQ."""
        parsed = parse_event(record.value)
        if isinstance(parsed, Rejected):
            return _Letter(parsed)
        event_id = str(parsed.event_id)
        try:
            connector = connector_base(self.settings, parsed.provider_participant)
        except UnroutableProvider:
            return _Letter(Rejected("unroutable", "no connector is configured for the provider", event_id))
        except ConnectorNotConfigured:
            return _Letter(
                Rejected("ds_not_configured", "CONNECTOR_INTERNAL_URL is not configured", event_id)
            )
        parent = cast(Context, context_from_kafka_headers(record.headers))
        return _Post(event_id, connector, audit_body(parsed), parent)

    async def _dead_letter(self, slot: Slot, letter: _Letter) -> Finished | Retry:
        record = slot.record
        # in the trace of the event (the producer's context), so the DLQ write is found there
        parent: Any = context_from_kafka_headers(record.headers)
        with _tracer.start_as_current_span(
            "audit_relay.dead_letter",
            context=parent,
            kind=trace.SpanKind.PRODUCER,
            attributes=_span_attributes(record, letter.rejected.event_id),
        ) as span:
            span.set_attribute("audit_relay.dlq_reason", letter.rejected.reason)
            return await self._write_dead_letter(slot, letter)

    async def _write_dead_letter(self, slot: Slot, letter: _Letter) -> Finished | Retry:
        record, rejected = slot.record, letter.rejected
        value = dead_letter(
            rejected,
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            key=record.key,
            value=record.value,
            ds_status=letter.ds_status,
        )
        headers = [*(record.headers or ()), ("dlq-reason", rejected.reason.encode())]
        try:
            await self.producer.send_and_wait(
                self.settings.audit_relay_dlq_topic, value, key=record.key, headers=headers
            )
        except KafkaError as exc:
            log.warning("dead_letter_write_failed", error=type(exc).__name__)
            return Retry("dlq_write")
        slot.connector = None  # ds has had its answer; the DLQ holds the rest
        self.metrics.dead_lettered.labels(rejected.reason).inc()
        self.metrics.outcome("dead_lettered")
        log.warning(
            "dead_lettered",
            reason=rejected.reason,
            detail=rejected.detail,
            event_id=rejected.event_id,
            partition=record.partition,
            offset=record.offset,
        )
        return FINISHED

    # -- retries --------------------------------------------------------------------------------------
    def backoff(self, outcome: Retry) -> Callable[[int], float]:
        s = self.settings

        def delay(attempt: int) -> float:
            return backoff_delay(
                attempt,
                initial_s=s.audit_relay_backoff_initial_s,
                max_s=s.audit_relay_backoff_max_s,
                retry_after_s=outcome.retry_after_s,
                retry_after_max_s=s.audit_relay_retry_after_max_s,
            )

        return delay

    def count_retry(self, outcome: Retry, slot: Slot, delay_s: float | None) -> None:
        self.metrics.retried.labels(outcome.cause).inc()
        self.metrics.outcome("retried")
        prepared = slot.prepared
        event_id = prepared.event_id if isinstance(prepared, _Post) else None
        if isinstance(prepared, _Letter):
            event_id = prepared.rejected.event_id
        log.warning(
            "delivery_retry",
            event_id=event_id,
            partition=slot.record.partition,
            offset=slot.record.offset,
            cause=outcome.cause,
            attempt=slot.attempts,
            # none: it was in flight beside the record that failed first, and waits behind it
            delay_s=None if delay_s is None else round(delay_s, 3),
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
