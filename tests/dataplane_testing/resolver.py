"""Support of the filter-resolver tests: the gateway's side of a claim check (in Redis, and over
Kafka against real `filter-resolver` processes), settings, a small HTTP double for `http_in_list`
endpoints and a bare TCP listener."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer, ConsumerRecord
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from redis.asyncio import Redis

from dataplane_contracts.events import PlanRequest, PlanResolved
from dataplane_contracts.plans import (
    CallerIdentity,
    ClaimCheck,
    Plan,
    plan_cache_key,
    redis_claim_key,
    redis_one_shot_key,
    redis_plan_key,
)
from dataplane_contracts.topics import PLAN_REPLIES, PLAN_REQUESTS, TopicSpec, topic_specs
from filter_resolver.settings import Settings

from .gateway import CACHE_SECRET
from .processes import ServiceProcess
from .topics import assigned, follow

SECRET = "filter-resolver-test-secret-0123456789"
CLIENT_ID = "svc-filter-resolver"
CLIENT_SECRET = "resolver-client-secret"
LOOKUP_SCOPE = "rec-registry.lookup"


def make_settings(**overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "kafka_bootstrap_servers": "127.0.0.1:1",
        "redis_url": "redis://127.0.0.1:1/0",
        "row_filters_cache_key_secret": SECRET,
        "celine_oidc_client_id": CLIENT_ID,
        "celine_oidc_client_secret": CLIENT_SECRET,
        "resolver_retry_base_ms": 1,
    }
    values.update(overrides)
    return Settings(**values)


def resolver_beside(kafka: str, redis: str, test: str) -> Settings:
    """A resolver beside a test's own broker and Redis, in a consumer group of its own (named
    after `test`, unique per run), answering quickly; the cache key secret is the one the
    gateway settings of `dataplane_testing.gateway` share."""
    return Settings(
        kafka_bootstrap_servers=kafka,
        kafka_fetch_max_wait_ms=10,
        kafka_enable_idempotence=False,
        redis_url=redis,
        row_filters_cache_key_secret=CACHE_SECRET,
        resolver_group_id=f"{test}-{os.getpid()}-{time.monotonic_ns()}",
    )


def person(issuer: Any, username: str, *, email: str | None = None, expires_in: int = 300) -> CallerIdentity:
    """A person's identity with a real token minted by the OIDC double."""
    sub = str(uuid.uuid5(uuid.NAMESPACE_DNS, username))
    token = issuer.mint({"sub": sub, "preferred_username": username}, expires_in=expires_in)
    return CallerIdentity(
        sub=sub,
        username=username,
        email=email or f"{username}@example.org",
        token=token,
        token_exp=int(time.time()) + expires_in,
    )


def service_account(issuer: Any, client: str = "digital-twin") -> CallerIdentity:
    token = issuer.service_token(client)
    return CallerIdentity(
        sub=str(uuid.uuid5(uuid.NAMESPACE_DNS, client)),
        username=f"service-account-{client}",
        service_account=True,
        token=token,
        token_exp=int(time.time()) + 300,
    )


def claim(handler: str, args: dict[str, Any], **fields: Any) -> ClaimCheck:
    return ClaimCheck(handler=handler, args=args, table=fields.pop("table", "public.readings"), **fields)


def cache_key_of(check: ClaimCheck, secret: str = SECRET) -> str:
    return plan_cache_key(check.key_inputs(), secret.encode())


async def put_claim(
    redis: Redis,
    check: ClaimCheck,
    *,
    deadline_s: float = 15.0,
    reply_topic: str = PLAN_REPLIES,
    reply_partition: int | None = None,
    cache_key: str | None = None,
) -> PlanRequest:
    """What the gateway does before publishing: the claim into Redis, then the request."""
    claim_id = uuid.uuid4().hex
    await redis.set(redis_claim_key(claim_id), check.model_dump_json(), ex=max(1, int(deadline_s)))
    return PlanRequest(
        cache_key=cache_key or cache_key_of(check),
        claim_check_id=claim_id,
        correlation_id=uuid.uuid4().hex,
        reply_topic=reply_topic,
        reply_partition=reply_partition,
        deadline=datetime.now(UTC) + timedelta(seconds=deadline_s),
    )


async def read_plan(redis: Redis, reply: PlanResolved) -> Plan:
    """What the gateway does with a reply."""
    if reply.outcome == "cached":
        raw = await redis.get(redis_plan_key(reply.cache_key))
    else:
        assert reply.one_shot_id is not None, reply
        raw = await redis.getdel(redis_one_shot_key(reply.one_shot_id))
    assert raw is not None, "the reply names a plan that is not in Redis"
    return Plan.model_validate_json(raw)


# ---- an http_in_list endpoint double ------------------------------------------------------------


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes
    query_items: list[tuple[str, str]] = field(default_factory=list)  # repeated names kept
    header_items: list[tuple[str, str]] = field(default_factory=list)  # likewise, names lower-cased


@dataclass
class ListEndpoint:
    """Answers the programmed answers in order, then `default`; records every request."""

    default: tuple[int, Any] = (200, [])
    queue: list[tuple[int, Any]] = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def reset(self, default: tuple[int, Any] = (200, [])) -> None:
        with self.lock:
            self.default, self.queue, self.seen = default, [], []

    def then(self, *answers: tuple[int, Any]) -> None:
        with self.lock:
            self.queue.extend(answers)

    def calls(self) -> list[Seen]:
        with self.lock:
            return list(self.seen)

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.api_route("/{path:path}", methods=["GET", "POST", "PUT"])
        async def any_route(request: Request, path: str) -> Response:
            body = await request.body()
            with self.lock:
                self.seen.append(
                    Seen(
                        request.method,
                        "/" + path,
                        dict(request.query_params),
                        {k.lower(): v for k, v in request.headers.items()},
                        body,
                        list(request.query_params.multi_items()),
                        [(k.lower(), v) for k, v in request.headers.items()],
                    )
                )
                status, payload = self.queue.pop(0) if self.queue else self.default
            if isinstance(payload, str):
                return PlainTextResponse(payload, status_code=status)
            return JSONResponse(payload, status_code=status)

        return app


# ---- a bare TCP listener: counts connection attempts where an HTTP double never sees a request --


class TcpDouble:
    """A real loopback listener that never answers HTTP: `close` hangs up on every connection
    (the client sees the server disconnect), `hold` keeps each one open without a byte back
    (the client's read timeout runs out). `connections` counts what the kernel accepted, so an
    attempt is counted even when it fails before any HTTP request could be read."""

    def __init__(self, mode: str) -> None:
        assert mode in ("close", "hold")
        self.mode = mode
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self._sock.settimeout(0.1)  # so the accept loop sees stop() without a connection
        self.port: int = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._held: list[Any] = []
        self._count = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name=f"tcp-double-{self.port}", daemon=True)
        self._thread.start()

    @property
    def connections(self) -> int:
        with self._lock:
            return self._count

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self._count += 1
            if self.mode == "close":
                conn.close()
            else:
                self._held.append(conn)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        for conn in self._held:
            conn.close()
        self._sock.close()


def refused_port() -> tuple[Any, int]:
    """A loopback port with no listener that stays reserved while the returned socket is open:
    a connection to it is refused by the kernel (nothing can count it but the client)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))  # bound, never listening: connect() gets ECONNREFUSED
    port: int = sock.getsockname()[1]
    return sock, port


# ---- real processes in one consumer group, and the gateway's Kafka side ------------------------

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


def resolver_env(bootstrap: str, redis_url: str, request_topic: str, **more: str) -> dict[str, str]:
    """A resolver process's settings on this broker, Redis and request topic; `more` adds
    variables (REC_REGISTRY_URL=…)."""
    return {
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "KAFKA_FETCH_MAX_WAIT_MS": "10",
        "KAFKA_ENABLE_IDEMPOTENCE": "false",
        "REDIS_URL": redis_url,
        "ROW_FILTERS_CACHE_KEY_SECRET": SECRET,
        "PLAN_REQUESTS_TOPIC": request_topic,
        **more,
    }


def start_resolver(env: dict[str, str], workdir: Path, name: str) -> ServiceProcess:
    """A `filter-resolver` process (its log lines on stderr, in `workdir/NAME.stderr`)."""
    script = Path(sys.executable).with_name("filter-resolver")
    process = ServiceProcess(
        [str(script)], {**os.environ, **env}, workdir / f"{name}.stderr", name, stdout_to_log=False
    )
    return process.start()


@dataclass
class Gateway:
    """The gateway's side of the request/reply: publishes requests, collects every reply."""

    bootstrap: str
    request_topic: str
    reply_topic: str
    producer: AIOKafkaProducer | None = None
    replies: dict[str, ConsumerRecord] = field(default_factory=dict)
    _arrived: asyncio.Condition = field(default_factory=asyncio.Condition)
    _task: asyncio.Task[None] | None = None
    _clients: contextlib.AsyncExitStack = field(default_factory=contextlib.AsyncExitStack)

    async def start(self) -> None:
        self.producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap, linger_ms=0, enable_idempotence=False
        )
        await self.producer.start()
        replies = assigned(self.bootstrap, [self.reply_topic], partitions=range(PARTITIONS))
        consumer, _ = await self._clients.enter_async_context(replies)
        self._task = asyncio.create_task(follow(consumer, self._arrive))

    async def _arrive(self, record: ConsumerRecord) -> None:
        reply = PlanResolved.model_validate_json(record.value or b"")
        async with self._arrived:
            self.replies[reply.correlation_id] = record
            self._arrived.notify_all()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._clients.aclose()
        if self.producer is not None:
            await self.producer.stop()

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


@contextlib.asynccontextmanager
async def gateway(bootstrap: str, request_topic: str, reply_topic: str) -> AsyncIterator[Gateway]:
    gw = Gateway(bootstrap, request_topic, reply_topic)
    await gw.start()
    try:
        yield gw
    finally:
        await gw.stop()


def render(record: ConsumerRecord) -> str:
    """Everything a record carries, as text, for leak checks."""
    parts: list[Any] = [record.key or b"", record.value or b""]
    parts += [k.encode() + b"=" + v for k, v in (record.headers or [])]
    return "\n".join(p.decode(errors="replace") for p in parts)
