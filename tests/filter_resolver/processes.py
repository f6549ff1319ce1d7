"""Two real `filter-resolver` processes in one consumer group, and the gateway's Kafka side
(publish a PlanRequest, read replies by manual partition assignment), for the process tests."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition

from dataplane_contracts.events import PlanRequest, PlanResolved
from dataplane_contracts.topics import PLAN_REPLIES, PLAN_REQUESTS, TopicSpec, topic_specs
from dataplane_local.infra import free_port
from dataplane_local.procs import stop_process
from dataplane_service_kit.topics_cli import create_topics

PARTITIONS = 6


def module_topics(suffix: str) -> tuple[list[TopicSpec], str, str]:
    """The contract's request and reply topics, renamed for this module so other folders' tests
    on the same broker never meet them."""
    by_name = {s.name: s for s in topic_specs()}
    req, rep = f"{PLAN_REQUESTS}.test-{suffix}", f"{PLAN_REPLIES}.test-{suffix}"
    specs = [
        TopicSpec(req, PARTITIONS, by_name[PLAN_REQUESTS].config),
        TopicSpec(rep, PARTITIONS, by_name[PLAN_REPLIES].config),
    ]
    return specs, req, rep


@dataclass
class ResolverProcess:
    proc: subprocess.Popen[bytes]
    url: str
    stderr_path: Path

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    async def metric(self, name: str) -> float:
        async with httpx.AsyncClient() as client:
            text = (await client.get(self.url + "/metrics")).text
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name) and not line.startswith("#"):
                total += float(line.rsplit(" ", 1)[1])
        return total

    async def ready(self) -> bool:
        try:
            async with httpx.AsyncClient() as client:
                return (await client.get(self.url + "/readyz", timeout=2)).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        stop_process(self.proc)


def start_resolver(env: dict[str, str], workdir: Path, name: str) -> ResolverProcess:
    port = free_port()
    script = Path(sys.executable).with_name("filter-resolver")
    stderr_path = workdir / f"{name}.stderr"
    full_env = {**os.environ, **env, "HTTP_HOST": "127.0.0.1", "HTTP_PORT": str(port)}
    with stderr_path.open("wb") as err:
        proc = subprocess.Popen([str(script)], env=full_env, stdout=subprocess.DEVNULL, stderr=err)
    return ResolverProcess(proc, f"http://127.0.0.1:{port}", stderr_path)


@dataclass
class Gateway:
    """The gateway's side of the request/reply: publishes requests, collects every reply."""

    bootstrap: str
    request_topic: str
    reply_topic: str
    producer: AIOKafkaProducer | None = None
    consumer: AIOKafkaConsumer | None = None
    replies: dict[str, ConsumerRecord] = field(default_factory=dict)
    _arrived: asyncio.Condition = field(default_factory=asyncio.Condition)
    _task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap, linger_ms=0, enable_idempotence=False
        )
        await self.producer.start()
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap, enable_auto_commit=False, fetch_max_wait_ms=10
        )
        self.consumer.assign([TopicPartition(self.reply_topic, p) for p in range(PARTITIONS)])
        await self.consumer.start()
        await self.consumer.seek_to_beginning()
        self._task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.consumer is not None
        async for record in self.consumer:
            reply = PlanResolved.model_validate_json(record.value or b"")
            async with self._arrived:
                self.replies[reply.correlation_id] = record
                self._arrived.notify_all()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for client in (self.consumer, self.producer):
            if client is not None:
                await client.stop()

    async def send(self, request: PlanRequest, headers: list[tuple[str, bytes]] | None = None) -> None:
        assert self.producer is not None
        await self.producer.send_and_wait(
            self.request_topic,
            request.model_dump_json().encode(),
            key=request.cache_key.encode(),
            headers=[("correlation_id", request.correlation_id.encode()), *(headers or [])],
        )

    async def send_raw(self, value: bytes) -> None:
        assert self.producer is not None
        await self.producer.send_and_wait(self.request_topic, value)

    async def reply(self, correlation_id: str, timeout: float = 20.0) -> ConsumerRecord:
        async with asyncio.timeout(timeout), self._arrived:
            await self._arrived.wait_for(lambda: correlation_id in self.replies)
            return self.replies[correlation_id]

    async def ask(self, request: PlanRequest) -> PlanResolved:
        await self.send(request)
        record = await self.reply(request.correlation_id)
        return PlanResolved.model_validate_json(record.value or b"")


async def all_records(bootstrap: str, topics: list[str]) -> list[ConsumerRecord]:
    """Every record on the topics, read from the beginning to the current end."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=10)
    tps = [TopicPartition(t, p) for t in topics for p in range(PARTITIONS)]
    consumer.assign(tps)
    await consumer.start()
    try:
        await consumer.seek_to_beginning()
        ends = await consumer.end_offsets(tps)
        out: list[ConsumerRecord] = []
        async with asyncio.timeout(20):
            while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
                batch = await consumer.getmany(timeout_ms=200)
                for records in batch.values():
                    out.extend(records)
        return out
    finally:
        await consumer.stop()


@contextlib.asynccontextmanager
async def gateway(bootstrap: str, request_topic: str, reply_topic: str) -> AsyncIterator[Gateway]:
    gw = Gateway(bootstrap, request_topic, reply_topic)
    await gw.start()
    try:
        yield gw
    finally:
        await gw.stop()


async def make_topics(bootstrap: str, specs: list[TopicSpec]) -> None:
    await create_topics(bootstrap, specs)


def render(record: ConsumerRecord) -> str:
    """Everything a record carries, as text, for leak checks."""
    parts: list[Any] = [record.key or b"", record.value or b""]
    parts += [k.encode() + b"=" + v for k, v in (record.headers or [])]
    return "\n".join(p.decode(errors="replace") for p in parts)
