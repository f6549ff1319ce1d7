"""The audit-relay as a real process against a real broker, real HTTP doubles of two ds connectors
and an OIDC issuer. Faults are injected through the doubles' in-process objects (they serve HTTP
from a thread of the test process; the relay is a subprocess)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from fastapi import FastAPI, Request, Response

from dataplane_contracts.topics import TopicSpec
from dataplane_local.doubles._common import Call
from dataplane_local.doubles.ds_connector import DsConnectorDouble, create_app
from dataplane_local.doubles.oidc import JWKS_PATH, OidcIssuer
from dataplane_local.doubles.server import RunningServer, serve_in_thread

from . import topics
from .metrics import sample, total  # noqa: F401 - the tests read both as h.sample, h.total
from .polling import wait_for
from .processes import ServiceProcess
from .topics import assigned, follow

# murmur2 puts these two keys on different partitions of a 6-partition topic (tests assert it)
PROVIDER_A = "did:web:provider-a.example"
PROVIDER_B = "did:web:provider-c.example"
UNROUTABLE = "did:web:nobody.example"
# the participant behind CONNECTOR_INTERNAL_URL; never a key of CONNECTOR_INTERNAL_URLS
DEFAULT_PROVIDER = "did:web:default-connector.example"
PARTITIONS = 6
CLIENT_ID = "svc-audit-relay"
CLIENT_SECRET = "relay-secret-for-tests"
AUDIT_FIELDS = {
    "dataset_id",
    "consumer_id",
    "user_id",
    "subject_id",
    "agreement_id",
    "transfer_id",
    "row_count",
    "authorized_subject_ids",
    "decision_ref",
}

EVENT_FIELDS = {
    "event_id",
    "occurred_at",
    "schema_version",
    "provider_participant",
    "consumer_id",
    "agreement_id",
    "transfer_id",
    "dataset_id",
    "row_count",
    "decision_ref",
    "authorized_subject_ids",
}


def event(provider: str = PROVIDER_A, **overrides: Any) -> dict[str, Any]:
    """A DisclosureRecorded as the gateway publishes it (JSON-ready)."""
    body: dict[str, Any] = {
        "event_id": str(uuid.uuid4()),
        "occurred_at": datetime.now(UTC).isoformat(),
        "schema_version": 1,
        "provider_participant": provider,
        "consumer_id": "did:web:consumer.example",
        "agreement_id": "agr-1",
        "transfer_id": "tp-1",
        "dataset_id": "meter_readings",
        "row_count": 3,
        "decision_ref": "ab" * 32,
        "authorized_subject_ids": ["did:web:alice.example"],
    }
    body.update(overrides)
    return body


@dataclass
class Connector:
    provider: str
    double: DsConnectorDouble
    server: RunningServer

    def audit_calls(self, event_ids: Iterable[str] | None = None) -> list[Call]:
        calls = self.double.calls("audit")
        if event_ids is None:
            return calls
        wanted = set(event_ids)
        return [c for c in calls if c.headers.get("idempotency-key") in wanted]

    def accepted_ids(self, event_ids: Iterable[str] | None = None) -> list[str]:
        return [c.headers["idempotency-key"] for c in self.audit_calls(event_ids) if 200 <= c.status < 300]


def relay_process(env: dict[str, str], log_path: Path) -> ServiceProcess:
    """`python -m audit_relay` with this environment (not started); a restart appends to the log."""
    argv = [sys.executable, "-m", "audit_relay"]
    return ServiceProcess(argv, env, log_path, "relay", append=True, ready_timeout=30.0)


async def wait_counter(relay: ServiceProcess, name: str, at_least: float, **labels: str) -> float:
    """The counter once it reached `at_least`, so a caller can assert it did not go past it."""
    value = 0.0

    async def reached() -> bool:
        nonlocal value
        value = sample(await asyncio.to_thread(relay.metrics), name, **labels)
        return value >= at_least

    await wait_for(reached, 30, f"{name}{labels} to reach {at_least}")
    return value


@dataclass
class Harness:
    bootstrap: str
    topic: str
    dlq_topic: str
    a: Connector
    b: Connector
    issuer: OidcIssuer
    issuer_server: RunningServer
    relay: ServiceProcess
    producer: AIOKafkaProducer
    # CONNECTOR_INTERNAL_URL of the shared relay, set alongside CONNECTOR_INTERNAL_URLS: it serves
    # only events that name no provider (docs/gateway.md, connector rules 2 and 3)
    default: Connector
    dlq: list[dict[str, Any]] = field(default_factory=list)
    dlq_headers: list[dict[str, bytes]] = field(default_factory=list)

    def connector(self, provider: str) -> Connector:
        return self.a if provider == PROVIDER_A else self.b

    async def publish(self, events: list[dict[str, Any]], key: str | None = None) -> list[int]:
        """Publish in order, keyed by provider (or `key`); returns each record's partition."""
        partitions = []
        for ev in events:
            partitions.append(
                await self.publish_raw(json.dumps(ev).encode(), key or ev["provider_participant"])
            )
        return partitions

    async def publish_raw(self, value: bytes | None, key: str) -> int:
        meta = await self.producer.send_and_wait(self.topic, value, key=key.encode())
        partition: int = meta.partition
        return partition

    async def wait_accepted(self, events: list[dict[str, Any]], timeout: float = 60.0) -> None:
        def done() -> bool:
            got = set(self.a.accepted_ids()) | set(self.b.accepted_ids()) | set(self.default.accepted_ids())
            return all(ev["event_id"] in got for ev in events)

        await wait_for(done, timeout, f"{len(events)} deliveries (log: {self.relay.log_path})")

    def dead_letters(self, event_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
        """The dead letters of these events, by the dead-lettered event's id."""
        wanted = set(event_ids)
        return {d["source_event_id"]: d for d in self.dlq if d.get("source_event_id") in wanted}

    async def wait_dead_letters(
        self, event_ids: list[str], timeout: float = 30.0
    ) -> dict[str, dict[str, Any]]:
        await wait_for(
            lambda: len(self.dead_letters(event_ids)) == len(set(event_ids)), timeout, "dead letters"
        )
        return self.dead_letters(event_ids)


async def read_dlq(
    bootstrap: str, topic: str, sink: list[dict[str, Any]], headers: list[dict[str, bytes]]
) -> None:
    """Follow the DLQ (partition 0) until cancelled."""

    def take(record: Any) -> None:
        sink.append(json.loads(record.value))
        headers.append(dict(record.headers))

    async with assigned(bootstrap, [topic], partitions=[0]) as (consumer, _):
        await follow(consumer, take)


def start_connector(provider: str, issuer: OidcIssuer) -> Connector:
    double = DsConnectorDouble(
        {"participant_id": provider, "agreements": {}},
        # ds verifies our service bearer against the issuer, as the real connector does
        service_auth={"jwks_url": issuer.base_url + JWKS_PATH},
    )
    return Connector(provider, double, serve_in_thread(create_app(double)))


async def make_topics(bootstrap: str, topic: str, dlq_topic: str) -> None:
    await topics.make_topics(bootstrap, [TopicSpec(topic, PARTITIONS), TopicSpec(dlq_topic, 1)])


def relay_env(
    bootstrap: str,
    topic: str,
    dlq_topic: str,
    group: str,
    issuer: OidcIssuer,
    urls: dict[str, str],
    default_url: str | None = None,
    **overrides: str,
) -> dict[str, str]:
    """The relay's environment; `overrides` are further variables (AUDIT_RELAY_HTTP_TIMEOUT_S=…)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AUDIT_RELAY_", "CONNECTOR_", "CELINE_"))}
    env.update(
        {
            "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
            "KAFKA_FETCH_MAX_WAIT_MS": "10",
            "KAFKA_ENABLE_IDEMPOTENCE": "false",
            "HTTP_HOST": "127.0.0.1",
            "LOG_LEVEL": "INFO",
            "CONNECTOR_INTERNAL_URLS": json.dumps(urls),
            "CELINE_OIDC_BASE_URL": issuer.base_url,
            "CELINE_OIDC_CLIENT_ID": CLIENT_ID,
            "CELINE_OIDC_CLIENT_SECRET": CLIENT_SECRET,
            "AUDIT_RELAY_GROUP_ID": group,
            "AUDIT_RELAY_TOPIC": topic,
            "AUDIT_RELAY_DLQ_TOPIC": dlq_topic,
            "AUDIT_RELAY_UNREADY_GRACE_S": "2",
            "AUDIT_RELAY_BACKOFF_INITIAL_S": "0.1",
            "AUDIT_RELAY_BACKOFF_MAX_S": "1",
            "AUDIT_RELAY_MONITOR_INTERVAL_S": "0.5",
            "AUDIT_RELAY_SESSION_TIMEOUT_MS": "6000",
        }
    )
    if default_url is not None:
        env["CONNECTOR_INTERNAL_URL"] = default_url
    env.update(overrides)
    return env


def json_bytes(ev: dict[str, Any]) -> bytes:
    return json.dumps(ev).encode()


@dataclass(frozen=True)
class Post:
    """One audit post as the observing double saw it: server-side start and end (monotonic)."""

    key: str | None
    body: Any
    status: int
    started: float
    ended: float


class ObservingDs:
    """A ds connector double that watches the relay's concurrency: every audit post is answered
    after `delay_s`, with 503 for the event ids in `failing`, and recorded with when it started
    and ended, so a test can tell how many posts were in flight at once and in which order. A
    post of an event id passed to `hold` gets no answer until `release` (`held` counts those
    waiting), then 503. It checks no bearer (the ds connector double does; concurrency is the
    point here)."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.failing: set[str] = set()
        self.holding: set[str] = set()
        self.held = 0
        self._released = threading.Event()
        self._released.set()
        self._lock = threading.Lock()
        self._posts: list[Post] = []
        self.current = 0
        self.max_concurrent = 0

    def hold(self, keys: Iterable[str]) -> None:
        self.holding = set(keys)
        self._released.clear()

    def release(self) -> None:
        self.holding = set()
        self._released.set()

    def posts(self, keys: Iterable[str] | None = None) -> list[Post]:
        with self._lock:
            posts = sorted(self._posts, key=lambda p: p.ended)
        if keys is None:
            return posts
        wanted = set(keys)
        return [p for p in posts if p.key in wanted]

    def accepted(self, keys: Iterable[str] | None = None) -> list[str]:
        return [str(p.key) for p in self.posts(keys) if p.status == 200]

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/internal/audit/query")
        async def audit(request: Request) -> Response:
            started = time.monotonic()
            with self._lock:
                self.current += 1
                self.max_concurrent = max(self.max_concurrent, self.current)
            try:
                body = await request.json()
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                key = request.headers.get("idempotency-key")
                was_held = key in self.holding
                if was_held:
                    self.held += 1
                    await asyncio.to_thread(self._released.wait)
                    self.held -= 1
                status = 503 if key in self.failing or was_held else 200
            finally:
                with self._lock:
                    self.current -= 1
            with self._lock:
                self._posts.append(Post(key, body, status, started, time.monotonic()))
            return Response(b"{}", status_code=status, media_type="application/json")

        return app


def max_overlap(posts: Iterable[Post]) -> int:
    """The most posts whose [started, ended] intervals overlap at one instant."""
    edges = sorted([(p.started, 1) for p in posts] + [(p.ended, -1) for p in posts])
    current = best = 0
    for _, step in edges:
        current += step
        best = max(best, current)
    return best


async def committed(bootstrap: str, group: str, tp: TopicPartition) -> int | None:
    """The group's committed offset, read without joining the group (no rebalance)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        offset: int | None = await consumer.committed(tp)
        return offset
    finally:
        await consumer.stop()


def window_of(relay_env: dict[str, str]) -> int:
    """The per-partition in-flight bound a relay runs with (its setting, or the default)."""
    from audit_relay.settings import Settings

    name = "AUDIT_RELAY_MAX_IN_FLIGHT_PER_PARTITION"
    if name in relay_env:
        return int(relay_env[name])
    default = Settings.model_fields["audit_relay_max_in_flight_per_partition"].default
    assert isinstance(default, int)
    return default


def assert_bounded_order(accepted: list[str], published: list[str], window: int) -> None:
    """The ordering the relay promises within one partition (window.py): an event is accepted
    only after every event `window` or more places before it was. With window 1: publish order."""
    place = {key: i for i, key in enumerate(published)}
    seen: set[int] = set()
    low = 0  # every event before this place has been accepted
    for key in accepted:
        i = place[key]
        assert i - window < low, f"event #{i} accepted before #{low} (window {window})"
        seen.add(i)
        while low in seen:
            low += 1
