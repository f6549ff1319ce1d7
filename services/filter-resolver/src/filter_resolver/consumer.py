"""The Kafka side: consumer group on the plan-request topic, replies to each request's topic.

The ack policy, explicit: commit a request's offset only once its reply is published. Plain
aiokafka with auto-commit off, rather than a FastStream subscriber's `ack_policy`, because:

- A batch is resolved concurrently, within a partition too: lookups wait on HTTP and identical
  requests in flight are resolved once (resolver.py), which only works when they are in flight
  together. FastStream acks a message when its handler returns, one message at a time per
  consumer, and a batch subscriber acks its batch as a whole; its concurrent mode (`max_workers`)
  is either `AckPolicy.ACK_FIRST` — the offset committed before the work, so a request whose
  reply never got out is lost — or one group member per worker, each still sequential and each a
  group join (seconds on the local broker).
- The reply goes to the topic *and partition* the request names (each gateway replica reads its
  own partition by manual assignment); FastStream's automatic reply knows only `reply_to`.

So: per partition the offset advances to the first request whose reply could not be published;
the consumer seeks back to it, waits a short, growing pause (a broker refusing the reply must
not turn into a busy loop), and reads it again. The commit itself runs beside the next fetch
(commits one after another, in order): the replies are out by then, and a commit awaited before
the next fetch would only delay the requests that came meanwhile.

At least once: the claim check was taken by the first reading, so the second is answered from
the plan it cached (resolver.py); the gateway keeps only the first reply per correlation id.

The fetch wait: KAFKA_RPC_FETCH_MAX_WAIT_MS while requests come, RESOLVER_IDLE_FETCH_MAX_WAIT_MS
once none has come for RESOLVER_IDLE_AFTER_MS (a broker that sleeps out each wait costs CPU per
fetch, so an idle consumer should fetch seldom), back as soon as one arrives."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from typing import Any, cast

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from opentelemetry import trace
from opentelemetry.context import Context
from pydantic import ValidationError

from dataplane_contracts.events import PlanRequest, PlanResolved
from dataplane_service_kit.backoff import Backoff
from dataplane_service_kit.kafka import KAFKA_STOP_BOUND_S, kafka_producer
from dataplane_service_kit.logs import get_logger
from dataplane_service_kit.shutdown import bounded_stop
from dataplane_service_kit.telemetry import context_from_kafka_headers, kafka_headers
from filter_resolver.metrics import Metrics
from filter_resolver.resolver import Resolver
from filter_resolver.settings import Settings

log = get_logger(__name__)
tracer = trace.get_tracer("filter_resolver")

TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
HEX32 = re.compile(r"^[0-9a-f]{32}$")
HEX64 = re.compile(r"^[0-9a-f]{64}$")
RESTART_BACKOFF_S = (0.5, 5.0)  # first and longest wait before the consumer is opened again
# before reading again a request whose reply could not be published (first, longest)
REPLY_BACKOFF_S = (0.05, 2.0)


def set_fetch_wait(consumer: AIOKafkaConsumer, wait_ms: int) -> bool:
    """Change a started consumer's fetch wait; False when this aiokafka does not allow it.

    aiokafka has no public setter, but its fetcher reads `_fetch_max_wait_ms` afresh for each
    FetchRequest it builds (aiokafka 0.14, `Fetcher._get_actions_per_node`), so the next fetch
    uses the new wait. When the attribute is not there the wait simply stays as configured:
    slower or costlier when idle, never wrong (tests/filter_resolver pins that it is there)."""
    fetcher = getattr(consumer, "_fetcher", None)
    if fetcher is None or not isinstance(getattr(fetcher, "_fetch_max_wait_ms", None), int):
        return False
    fetcher._fetch_max_wait_ms = wait_ms
    return True


class _Assignments(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, metrics: Metrics) -> None:
        self.partitions: set[TopicPartition] = set()
        self._metrics = metrics

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        self.partitions.difference_update(revoked)
        self._metrics.assigned_partitions.set(len(self.partitions))

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        self.partitions = set(assigned)
        self._metrics.assigned_partitions.set(len(self.partitions))
        log.info("partitions_assigned", partitions=sorted(tp.partition for tp in assigned))


class PlanRequestConsumer:
    def __init__(self, settings: Settings, resolver: Resolver, metrics: Metrics) -> None:
        self._settings = settings
        self._resolver = resolver
        self._assignments = _Assignments(metrics)
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._task: asyncio.Task[None] | None = None
        self._committing: asyncio.Task[None] | None = None
        self._metrics = metrics
        self._stopping = False
        self.fetch_wait_ms = settings.rpc_fetch_max_wait_ms()  # the wait in force (tests read it)

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="plan-request-consumer")

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self._close()

    def ready(self) -> bool:
        """Ready only while this member holds partitions of the request topic."""
        return self._consumer is not None and bool(self._assignments.partitions)

    async def _open(self) -> None:
        s = self._settings
        self._producer = kafka_producer(s)
        await self._producer.start()
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=s.kafka_bootstrap_servers,
            group_id=s.resolver_group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",  # a new group must not skip a request sent as it joins
            fetch_max_wait_ms=s.rpc_fetch_max_wait_ms(),
            max_poll_records=s.resolver_max_batch,
        )
        self._consumer.subscribe([s.plan_requests_topic], listener=self._assignments)
        await self._consumer.start()
        self.fetch_wait_ms = s.rpc_fetch_max_wait_ms()

    async def _close(self) -> None:
        consumer, producer = self._consumer, self._producer
        self._consumer = self._producer = None
        self._assignments.partitions.clear()
        committing, self._committing = self._committing, None
        if committing is not None:
            # the last offsets still go in before the consumer leaves; a broker that is gone
            # must not hold the close (the requests are read again: at least once)
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(committing), 5)
        # the consumer leaves its group here; then what the producer holds is flushed
        if consumer is not None:
            await bounded_stop("kafka_consumer", consumer.stop)
        if producer is not None:
            await bounded_stop("kafka_producer", producer.stop, KAFKA_STOP_BOUND_S)

    async def _run(self) -> None:
        restarts = Backoff(*RESTART_BACKOFF_S)
        while not self._stopping:
            try:
                await self._open()
                restarts.reset()
                await self._consume()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                delay = restarts.next()
                log.error("consumer_failed", error=type(exc).__name__, retry_in_s=delay)
                await self._close()
                await asyncio.sleep(delay)

    # -- consumption ------------------------------------------------------------------------------
    def _set_wait(self, consumer: AIOKafkaConsumer, wait_ms: int) -> None:
        if wait_ms != self.fetch_wait_ms and set_fetch_wait(consumer, wait_ms):
            self.fetch_wait_ms = wait_ms

    async def _consume(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        s = self._settings
        busy_ms = s.rpc_fetch_max_wait_ms()
        idle_ms = s.resolver_idle_fetch_max_wait_ms
        idle_after = s.resolver_idle_after_ms / 1000
        last_request = time.monotonic()
        unpublished = Backoff(*REPLY_BACKOFF_S)  # failures: batches in a row with a reply unpublished
        while True:
            batch = await consumer.getmany(timeout_ms=1000, max_records=s.resolver_max_batch)
            if not batch:
                if idle_ms is not None and time.monotonic() - last_request >= idle_after:
                    self._set_wait(consumer, idle_ms)
                continue
            self._set_wait(consumer, busy_ms)  # requests are coming: answer the next ones soon
            last_request = time.monotonic()
            records = [(tp, rec) for tp, recs in batch.items() for rec in recs]
            self._observe_fetch(records)
            published = await asyncio.gather(*(self._handle(rec) for _, rec in records))
            self._commit(consumer, records, published)
            if all(published):
                unpublished.reset()
                continue
            await asyncio.sleep(unpublished.next())

    def _observe_fetch(self, records: list[tuple[TopicPartition, ConsumerRecord]]) -> None:
        """From the request's produce time (the producer's clock, ms) to this consumer's hands."""
        now_ms = time.time() * 1000
        for _, rec in records:
            if rec.timestamp_type == 0 and rec.timestamp > 0:  # CreateTime
                self._metrics.hops.labels("fetch").observe(max(0.0, now_ms - rec.timestamp) / 1000)

    def _commit(
        self,
        consumer: AIOKafkaConsumer,
        records: list[tuple[TopicPartition, ConsumerRecord]],
        published: list[bool],
    ) -> None:
        offsets: dict[TopicPartition, int] = {}
        blocked: set[TopicPartition] = set()
        for (tp, rec), ok in zip(records, published, strict=True):
            if tp in blocked:
                continue
            if ok:
                offsets[tp] = rec.offset + 1
            else:
                blocked.add(tp)
                consumer.seek(tp, rec.offset)  # read it again: its reply is still owed
        if offsets:
            self._committing = asyncio.create_task(
                self._commit_after(self._committing, consumer, offsets), name="plan-request-commit"
            )

    async def _commit_after(
        self,
        previous: asyncio.Task[None] | None,
        consumer: AIOKafkaConsumer,
        offsets: dict[TopicPartition, int],
    ) -> None:
        if previous is not None:
            await asyncio.gather(previous, return_exceptions=True)  # in order: never an older one last
        started = time.perf_counter()
        try:
            await consumer.commit(offsets)
        except Exception as exc:  # a task of its own: nothing may escape it unseen
            # a rebalance took the partitions: their new holder reads these again (at least
            # once), which a consumer restart here would only make slower
            log.warning("offset_commit_failed", error=type(exc).__name__)
        finally:
            self._metrics.hops.labels("commit").observe(time.perf_counter() - started)

    async def _handle(self, record: ConsumerRecord) -> bool:
        """Resolve one record and publish its reply; False when the reply could not be published."""
        headers = cast(list[tuple[str, bytes]], list(record.headers or []))
        parent = cast(Context, context_from_kafka_headers(headers))
        with tracer.start_as_current_span(
            "plan_request process",
            context=parent,
            kind=trace.SpanKind.CONSUMER,
            attributes={"messaging.destination.name": record.topic, "messaging.partition": record.partition},
        ):
            request = self._parse(record)
            if request is None:
                return await self._answer_unreadable(record)
            log.debug("plan_request_received", correlation_id=request.correlation_id)
            try:
                reply = await self._resolver.process(request)
            except Exception as exc:
                # a defect must not turn one request into a poison pill that stops the partition
                log.error("plan_request_failed", error=type(exc).__name__)
                reply = PlanResolved(
                    correlation_id=request.correlation_id,
                    cache_key=request.cache_key,
                    outcome="error",
                    error_code="row_filter_unavailable",
                    error_detail="resolution failed",
                )
            return await self._publish(reply, request.reply_topic, request.reply_partition)

    def _parse(self, record: ConsumerRecord) -> PlanRequest | None:
        try:
            request = PlanRequest.model_validate_json(record.value or b"")
        except ValidationError:
            return None
        if not TOPIC_NAME.fullmatch(request.reply_topic):
            return None
        return request

    async def _answer_unreadable(self, record: ConsumerRecord) -> bool:
        """Answer an unreadable request when its correlation id and reply topic can be read;
        otherwise log it (the gateway's deadline covers it) and move on."""
        try:
            doc: Any = json.loads(record.value or b"")
        except ValueError:
            doc = None
        fields = doc if isinstance(doc, dict) else {}
        cid, topic, key = fields.get("correlation_id"), fields.get("reply_topic"), fields.get("cache_key")
        partition = fields.get("reply_partition")
        if not (
            isinstance(cid, str)
            and HEX32.fullmatch(cid)
            and isinstance(key, str)
            and HEX64.fullmatch(key)
            and isinstance(topic, str)
            and TOPIC_NAME.fullmatch(topic)
        ):
            log.warning("plan_request_unreadable", partition=record.partition, offset=record.offset)
            return True
        log.warning("plan_request_invalid", partition=record.partition, offset=record.offset)
        reply = PlanResolved(
            correlation_id=cid,
            cache_key=key,
            outcome="error",
            error_code="row_filter_invalid",
            error_detail="the plan request is unreadable",
        )
        return await self._publish(reply, topic, partition if isinstance(partition, int) else None)

    async def _publish(self, reply: PlanResolved, topic: str, partition: int | None) -> bool:
        producer = self._producer
        if producer is None:
            return False
        headers = [
            *kafka_headers(),
            ("correlation_id", reply.correlation_id.encode()),
            ("content-type", b"application/json"),
        ]
        started = time.perf_counter()
        try:
            if partition is not None and partition not in (await producer.partitions_for(topic) or set()):
                # no reader can be waiting there: nothing will ever be published, so skip it
                log.warning("plan_reply_unroutable", partition=partition)
                return True
            await producer.send_and_wait(
                topic,
                reply.model_dump_json().encode(),
                key=reply.correlation_id.encode(),
                partition=partition,
                headers=headers,
            )
        except Exception as exc:
            log.error("plan_reply_failed", error=type(exc).__name__)
            return False
        self._metrics.hops.labels("reply").observe(time.perf_counter() - started)
        return True
