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
not turn into a busy loop), and reads it again. At least once: the claim check was taken by the
first reading, so the second is answered from the plan it cached (resolver.py); the gateway keeps
only the first reply per correlation id."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any, cast

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.errors import KafkaError
from opentelemetry import trace
from opentelemetry.context import Context
from pydantic import ValidationError

from dataplane_contracts.events import PlanRequest, PlanResolved
from dataplane_service_kit.logs import get_logger
from dataplane_service_kit.telemetry import context_from_kafka_headers, kafka_headers
from filter_resolver.metrics import Metrics
from filter_resolver.resolver import Resolver
from filter_resolver.settings import Settings

log = get_logger(__name__)
tracer = trace.get_tracer("filter_resolver")

TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
HEX32 = re.compile(r"^[0-9a-f]{32}$")
HEX64 = re.compile(r"^[0-9a-f]{64}$")
RESTART_BACKOFF_S = (0.5, 1.0, 2.0, 5.0)
# before reading again a request whose reply could not be published
REPLY_BACKOFF_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0)


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
        self._stopping = False

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
        self._producer = AIOKafkaProducer(
            bootstrap_servers=s.kafka_bootstrap_servers,
            enable_idempotence=s.kafka_enable_idempotence,
            acks="all",
            linger_ms=0,
        )
        await self._producer.start()
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=s.kafka_bootstrap_servers,
            group_id=s.resolver_group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",  # a new group must not skip a request sent as it joins
            fetch_max_wait_ms=s.kafka_fetch_max_wait_ms,
            max_poll_records=s.resolver_max_batch,
        )
        self._consumer.subscribe([s.plan_requests_topic], listener=self._assignments)
        await self._consumer.start()

    async def _close(self) -> None:
        consumer, producer = self._consumer, self._producer
        self._consumer = self._producer = None
        self._assignments.partitions.clear()
        for client in (consumer, producer):
            if client is not None:
                try:
                    await client.stop()  # the consumer leaves its group here
                except Exception as exc:
                    log.warning("kafka_client_stop_failed", error=type(exc).__name__)

    async def _run(self) -> None:
        failures = 0
        while not self._stopping:
            try:
                await self._open()
                failures = 0
                await self._consume()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                delay = RESTART_BACKOFF_S[min(failures, len(RESTART_BACKOFF_S) - 1)]
                failures += 1
                log.error("consumer_failed", error=type(exc).__name__, retry_in_s=delay)
                await self._close()
                await asyncio.sleep(delay)

    # -- consumption ------------------------------------------------------------------------------
    async def _consume(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        unpublished = 0  # batches in a row with a reply left unpublished
        while True:
            batch = await consumer.getmany(timeout_ms=1000, max_records=self._settings.resolver_max_batch)
            if not batch:
                continue
            records = [(tp, rec) for tp, recs in batch.items() for rec in recs]
            published = await asyncio.gather(*(self._handle(rec) for _, rec in records))
            await self._commit(consumer, records, published)
            if all(published):
                unpublished = 0
                continue
            await asyncio.sleep(REPLY_BACKOFF_S[min(unpublished, len(REPLY_BACKOFF_S) - 1)])
            unpublished += 1

    async def _commit(
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
            try:
                await consumer.commit(offsets)
            except KafkaError as exc:
                # a rebalance took the partitions: their new holder reads these again (at least
                # once), which a consumer restart here would only make slower
                log.warning("offset_commit_failed", error=type(exc).__name__)

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
        return True
