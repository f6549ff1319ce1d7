"""The gateway side of the filter-resolver protocol (docs/row-filters.md, "Two phases").

Tiers: an in-process LRU (at most ROW_FILTERS_CACHE_MAXSIZE plans, honouring the Redis TTL), then
Redis, then a `PlanRequest` naming only the hashed cache key and a claim-check id; the inputs wait
in Redis under the claim id. Replies are read by manual assignment of one partition (no group),
from its end, keeping only this instance's correlation ids; an early copy of each reply comes on
this instance's Redis channel (query_gateway.clients.plan_notify). Identical misses coalesce.

The reply partition is paused while no request is pending and resumed before a request is sent:
a paused partition keeps its position (no reply is missed) but is not fetched, so an idle
gateway sends no fetches at all, which on a broker that sleeps out each fetch wait (the local
Tansu) is what keeps it cheap; while requests are pending it fetches with
KAFKA_RPC_FETCH_MAX_WAIT_MS — from the start when the reply channel is down, else only once a
request has waited PLAN_REPLY_KAFKA_FALLBACK_MS without its early copy."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError
from pydantic import ValidationError
from redis.exceptions import RedisError

from dataplane_contracts.events import PlanReplyCopy, PlanRequest, PlanResolved
from dataplane_contracts.plans import (
    ClaimCheck,
    Plan,
    plan_cache_key,
    redis_claim_key,
    redis_one_shot_key,
    redis_plan_key,
)
from dataplane_contracts.topics import PLAN_REPLIES, PLAN_REQUESTS
from dataplane_service_kit.bounded_cache import BoundedCache
from dataplane_service_kit.errors import ServiceError
from dataplane_service_kit.logs import get_logger
from dataplane_service_kit.telemetry import kafka_headers
from query_gateway.clients.plan_notify import ReplyChannel
from query_gateway.metrics import Metrics
from query_gateway.settings import Settings

log = get_logger("query_gateway.plans")


def _unavailable(detail: str) -> ServiceError:
    return ServiceError("row_filter_unavailable", detail)


class PlanLru:
    """Plans by cache key with their expiry; oldest evicted first when full."""

    def __init__(self, maxsize: int) -> None:
        self._items: BoundedCache[str, tuple[Plan, float]] = BoundedCache(maxsize)

    def get(self, key: str) -> Plan | None:
        item = self._items.get(key)
        if item is None:
            return None
        if item[1] <= time.monotonic():
            self._items.pop(key)
            return None
        return item[0]

    def put(self, key: str, plan: Plan, ttl_seconds: float) -> None:
        if ttl_seconds <= 0:
            return
        self._items.put(key, (plan, time.monotonic() + ttl_seconds))

    def __len__(self) -> int:
        return len(self._items)


@dataclass(frozen=True)
class _Answer:
    """A reply as it came: from Kafka the reply alone; from the early copy perhaps with the plan."""

    reply: PlanResolved
    plan: Plan | None = None
    ttl_seconds: int | None = None


class PlanClient:
    def __init__(
        self,
        settings: Settings,
        redis: aioredis.Redis,
        producer: AIOKafkaProducer,
        metrics: Metrics | None = None,
    ) -> None:
        self._settings = settings
        self._metrics = metrics if metrics is not None else Metrics()
        self._redis = redis
        self._producer = producer
        self._secret = settings.row_filters_cache_key_secret.get_secret_value().encode()
        self._timeout = settings.row_filters_resolve_timeout_ms / 1000
        self._fallback_s = settings.plan_reply_kafka_fallback_ms / 1000
        self.lru = PlanLru(settings.row_filters_cache_maxsize)
        self._inflight: dict[str, asyncio.Task[Plan]] = {}
        self._pending: dict[str, asyncio.Future[_Answer]] = {}
        self._consumer: AIOKafkaConsumer | None = None
        self._tp: TopicPartition | None = None
        self._paused = False
        self._reader: asyncio.Task[None] | None = None
        self.reply_partition: int | None = None
        self.positioned = False
        self.notify = ReplyChannel(redis, self._dispatch_copy)

    # ------------------------------------------------------------------ replies
    async def start(self) -> None:
        """Assign one reply partition and position it at its end before any request is sent."""
        partitions = sorted(await self._producer.partitions_for(PLAN_REPLIES))
        if not partitions:
            raise RuntimeError(f"topic {PLAN_REPLIES} has no partitions")
        chosen = self._settings.plan_reply_partition
        if chosen is None:
            chosen = partitions[zlib.crc32(uuid.uuid4().bytes) % len(partitions)]
        if chosen not in partitions:
            raise RuntimeError(f"PLAN_REPLY_PARTITION {chosen} does not exist on {PLAN_REPLIES}")
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self._settings.kafka_bootstrap_servers,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="latest",
            fetch_max_wait_ms=self._settings.rpc_fetch_max_wait_ms(),
        )
        await consumer.start()
        tp = TopicPartition(PLAN_REPLIES, chosen)
        consumer.assign([tp])
        await consumer.seek_to_end(tp)
        await consumer.position(tp)  # resolves the end offset now: from here no reply is missed
        self._consumer, self._tp = consumer, tp
        self._pause_if_idle()
        self.reply_partition = chosen
        self.positioned = True
        self._reader = asyncio.create_task(self._read(consumer), name="plan-replies")
        self.notify.start()

    async def stop(self) -> None:
        self.positioned = False
        await self.notify.stop()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self._consumer is not None:
            # a broker that is gone must not hold the shutdown
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(self._consumer.stop(), 10)

    async def _read(self, consumer: AIOKafkaConsumer) -> None:
        while True:
            try:
                batches: dict[Any, list[Any]] = await consumer.getmany(timeout_ms=1000)
            except KafkaError as exc:  # transient: keep the partition, keep reading
                log.warning("plan_replies_unreadable", error=type(exc).__name__)
                await asyncio.sleep(0.5)
                continue
            for records in batches.values():
                for record in records:
                    if self._dispatch_reply(record.value):  # the time of the replies that answered
                        self._observe_fetch(record.timestamp, record.timestamp_type)

    @property
    def fetching(self) -> bool:
        """Whether plan replies are being fetched now (only while a request is pending)."""
        return self._consumer is not None and not self._paused

    def _resume(self) -> None:
        """Fetch replies again: called with a request pending, before it is sent."""
        if self._paused and self._consumer is not None and self._tp is not None:
            self._consumer.resume(self._tp)
            self._paused = False

    def _pause_if_idle(self) -> None:
        """Stop fetching while nothing is pending; the position stays where it is."""
        if not self._pending and not self._paused and self._consumer is not None and self._tp is not None:
            self._consumer.pause(self._tp)
            self._paused = True

    def _observe_fetch(self, timestamp: int, timestamp_type: int) -> None:
        if timestamp_type == 0 and timestamp > 0:  # CreateTime, the resolver's clock (ms)
            self._metrics.miss_hops.labels("reply_fetch").observe(
                max(0.0, time.time() * 1000 - timestamp) / 1000
            )

    def _dispatch_reply(self, value: bytes | None) -> bool:
        """A Kafka reply; whether it answered a pending request."""
        if not value:
            return False
        try:
            reply = PlanResolved.model_validate_json(value)
        except ValidationError:
            log.warning("plan_reply_unreadable_skipped")
            return False
        return self._answer(_Answer(reply), "kafka")

    def _dispatch_copy(self, value: bytes) -> bool:
        """An early copy from this instance's channel; whether it answered a pending request."""
        try:
            copy = PlanReplyCopy.model_validate_json(value)
        except ValidationError:
            log.warning("plan_reply_copy_unreadable_skipped")
            return False
        return self._answer(_Answer(copy.reply, copy.plan, copy.ttl_seconds), "redis")

    def _answer(self, answer: _Answer, via: str) -> bool:
        future = self._pending.get(answer.reply.correlation_id)
        if future is None or future.done():  # other instances' replies, or the second copy
            return False
        future.set_result(answer)
        self._metrics.plan_replies_read.labels(via).inc()
        return True

    # ------------------------------------------------------------------ resolve
    async def resolve(self, claim: ClaimCheck) -> Plan:
        key = plan_cache_key(claim.key_inputs(), self._secret)
        plan = self.lru.get(key)
        if plan is None:
            plan = await self._from_redis(key)
        if plan is not None:
            self._metrics.plan_cache.labels("hit").inc()
            return plan
        self._metrics.plan_cache.labels("miss").inc()
        task = self._inflight.get(key)
        if task is None:
            task = asyncio.create_task(self._request_plan(key, claim))
            self._inflight[key] = task
            task.add_done_callback(self._forget(key))
        return await asyncio.shield(task)

    def _forget(self, key: str) -> Callable[[asyncio.Task[Plan]], None]:
        def done(_task: asyncio.Task[Plan]) -> None:
            self._inflight.pop(key, None)

        return done

    async def _from_redis(self, key: str) -> Plan | None:
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.get(redis_plan_key(key))
                pipe.pttl(redis_plan_key(key))
                raw, pttl = await pipe.execute()
        except RedisError:
            raise _unavailable("plan cache unavailable") from None
        if raw is None:
            return None
        try:
            plan = Plan.model_validate_json(raw)
        except ValidationError:
            raise _unavailable("cached plan unreadable") from None
        ttl = pttl / 1000 if isinstance(pttl, int) and pttl > 0 else self._settings.row_filters_cache_ttl
        self.lru.put(key, plan, ttl)
        return plan

    async def _request_plan(self, key: str, claim: ClaimCheck) -> Plan:
        for _attempt in range(2):  # a plan gone when read is requested once more, then 503
            answer = await self._ask(key, claim)
            reply = answer.reply
            if reply.outcome == "error":
                code = reply.error_code or "row_filter_unavailable"
                raise ServiceError(code, reply.error_detail or "row filter resolution failed")
            if answer.plan is not None and answer.ttl_seconds is not None and reply.cache_key == key:
                # the plan the resolver has just written came with the early copy: no read back
                self.lru.put(key, answer.plan, answer.ttl_seconds)
                return answer.plan
            read_started = time.perf_counter()
            try:
                if reply.outcome == "one_shot":
                    assert reply.one_shot_id is not None
                    raw = await self._redis.getdel(redis_one_shot_key(reply.one_shot_id))
                    if raw is not None:
                        return Plan.model_validate_json(raw)
                else:
                    plan = await self._from_redis(key)
                    if plan is not None:
                        return plan
            except RedisError:
                raise _unavailable("plan cache unavailable") from None
            except ValidationError:
                raise _unavailable("resolved plan unreadable") from None
            finally:
                self._metrics.miss_hops.labels("plan_read").observe(time.perf_counter() - read_started)
        raise _unavailable("resolved plan vanished before it was read")

    async def _ask(self, key: str, claim: ClaimCheck) -> _Answer:
        if not self.positioned or self.reply_partition is None:
            raise _unavailable("plan replies are not being read")
        claim_id, correlation_id = uuid.uuid4().hex, uuid.uuid4().hex
        deadline = datetime.now(UTC) + timedelta(seconds=self._timeout)
        future: asyncio.Future[_Answer] = asyncio.get_running_loop().create_future()
        self._pending[correlation_id] = future
        fallback: asyncio.TimerHandle | None = None
        if self.notify.live:
            # the early copy should answer: Kafka is fetched only if it has not come by then
            fallback = asyncio.get_running_loop().call_later(self._fallback_s, self._resume)
        else:
            self._resume()  # before the request goes out: its reply must find the reader fetching
        try:
            async with asyncio.timeout(self._timeout):
                started = time.perf_counter()
                try:
                    await self._redis.set(
                        redis_claim_key(claim_id),
                        claim.model_dump_json(),
                        px=max(1, int(self._timeout * 1000)),
                    )
                except RedisError:
                    raise _unavailable("claim check could not be stored") from None
                claimed = time.perf_counter()
                self._metrics.miss_hops.labels("claim").observe(claimed - started)
                request = PlanRequest(
                    cache_key=key,
                    claim_check_id=claim_id,
                    correlation_id=correlation_id,
                    reply_topic=PLAN_REPLIES,
                    reply_partition=self.reply_partition,
                    deadline=deadline,
                    reply_channel=self.notify.channel if self.notify.live else None,
                )
                await self._producer.send_and_wait(
                    PLAN_REQUESTS,
                    request.model_dump_json().encode(),
                    key=key.encode(),
                    headers=kafka_headers(),
                )
                sent = time.perf_counter()
                self._metrics.miss_hops.labels("request").observe(sent - claimed)
                reply = await future
                self._metrics.miss_hops.labels("reply").observe(time.perf_counter() - sent)
                return reply
        except TimeoutError:
            raise _unavailable("row filter resolution timed out") from None
        except KafkaError:
            raise _unavailable("plan request could not be published") from None
        finally:
            if fallback is not None:
                fallback.cancel()
            self._pending.pop(correlation_id, None)
            self._pause_if_idle()
