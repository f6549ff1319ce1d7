"""Kafka topics for the tests: creating them, and reading them by manual partition assignment
(no consumer group, so no join pause): to the current end, until a condition holds, or following
a topic until cancelled; `TopicTail` reads only what is published after it opened."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

from dataplane_contracts.topics import TopicSpec
from dataplane_local.timeouts import scaled
from dataplane_service_kit.topics_cli import create_topics


async def make_topics(bootstrap: str, specs: list[TopicSpec]) -> None:
    """The topics as `dataplane-topics create` makes them (idempotent)."""
    await create_topics(bootstrap, specs)


async def partitions_of(consumer: AIOKafkaConsumer, topic: str) -> list[TopicPartition]:
    """Every partition of `topic`, the consumer's metadata refreshed once if it knows none."""
    partitions = consumer.partitions_for_topic(topic)
    if not partitions:
        await consumer._client.force_metadata_update()
        partitions = consumer.partitions_for_topic(topic) or set()
    return [TopicPartition(topic, p) for p in sorted(partitions)]


def new_consumer(bootstrap: str) -> AIOKafkaConsumer:
    """A consumer of no group that commits nothing and answers a fetch without waiting."""
    return AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, fetch_max_wait_ms=10
    )


@contextlib.asynccontextmanager
async def assigned(
    bootstrap: str,
    topics: Iterable[str],
    *,
    partitions: Iterable[int] | None = None,
    from_end: bool = False,
) -> AsyncIterator[tuple[AIOKafkaConsumer, list[TopicPartition]]]:
    """A started consumer assigned every partition of the topics (or only `partitions` of each),
    at the beginning or at the current end; stopped on exit."""
    consumer = new_consumer(bootstrap)
    await consumer.start()
    try:
        tps: list[TopicPartition] = []
        for topic in topics:
            if partitions is None:
                tps += await partitions_of(consumer, topic)
            else:
                tps += [TopicPartition(topic, p) for p in partitions]
        consumer.assign(tps)
        if from_end:
            await consumer.seek_to_end(*tps)
            for tp in tps:  # resolve the end now: what is published from here on is read
                await consumer.position(tp)
        else:
            await consumer.seek_to_beginning(*tps)
        yield consumer, tps
    finally:
        await consumer.stop()


async def follow(
    consumer: AIOKafkaConsumer,
    on_record: Callable[[ConsumerRecord], Any],
    *,
    stop: Callable[[], bool] = lambda: False,
    timeout: float | None = None,
) -> None:
    """Hand every record the consumer fetches to `on_record` (awaited when it is a coroutine
    function) until `stop()` holds, the timeout (not scaled) passes or the task is cancelled."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while not stop() and (deadline is None or time.monotonic() < deadline):
        batch = await consumer.getmany(timeout_ms=200)
        for records in batch.values():
            for record in records:
                result = on_record(record)
                if inspect.isawaitable(result):
                    await result


async def read_to_end(
    bootstrap: str, topics: list[str], partitions: Iterable[int] | None = None
) -> list[ConsumerRecord]:
    """Every record on the topics, read from the beginning to the current end."""
    async with assigned(bootstrap, topics, partitions=partitions) as (consumer, tps):
        ends = await consumer.end_offsets(tps)
        out: list[ConsumerRecord] = []
        async with asyncio.timeout(20):
            while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
                batch = await consumer.getmany(timeout_ms=200)
                for records in batch.values():
                    out.extend(records)
        return out


async def ends_of(bootstrap: str, topic: str) -> dict[int, int]:
    """Where each partition of `topic` ends now: the offsets a later reader starts from."""
    async with assigned(bootstrap, [topic], from_end=True) as (consumer, tps):
        return {tp.partition: await consumer.position(tp) for tp in tps}


class TopicTail:
    """Reads a topic from its current end on every partition.

    Only records created after the tail opened are returned: the local broker may report an end
    offset just short of an event acknowledged a moment earlier, which would otherwise reach the
    next test as if it had been published there."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self._reader = assigned(bootstrap, [topic], from_end=True)
        self._consumer: AIOKafkaConsumer | None = None
        self._opened_ms = 0

    async def __aenter__(self) -> TopicTail:
        self._opened_ms = int(time.time() * 1000)  # producer CreateTime is wall-clock ms
        self._consumer, _ = await self._reader.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self._reader.__aexit__(*exc)

    def _fresh(self, batches: dict[Any, list[Any]]) -> list[Any]:
        return [r for records in batches.values() for r in records if r.timestamp >= self._opened_ms]

    async def read(self, count: int, timeout: float = 20.0) -> list[Any]:
        return await self.read_where(count, lambda _r: True, timeout)

    async def read_where(
        self, count: int, predicate: Callable[[Any], bool], timeout: float = 20.0
    ) -> list[Any]:
        """The first `count` records that satisfy `predicate` (others on the topic are skipped)."""
        assert self._consumer is not None
        out: list[Any] = []
        async with asyncio.timeout(scaled(timeout)):
            while len(out) < count:
                batches = await self._consumer.getmany(timeout_ms=200)
                out.extend(r for r in self._fresh(batches) if predicate(r))
        return out

    async def quiet(self, wait: float = 0.5) -> list[Any]:
        """Whatever arrives within `wait` seconds (used to prove nothing was published)."""
        assert self._consumer is not None
        return self._fresh(await self._consumer.getmany(timeout_ms=int(wait * 1000)))
