"""Real infrastructure for every test: PostgreSQL, Redis and a Kafka-protocol broker.

Tiers, in order: `TEST_DATABASE_URL` / `TEST_REDIS_URL` / `TEST_KAFKA_BOOTSTRAP` when set; a
testcontainers server when a Docker engine answers; otherwise the embedded servers of
`dataplane_local.infra`, started once per test session on loopback."""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest
import redis.asyncio as aioredis

from dataplane_local import infra

SERVICE_MODES: dict[str, str] = {}


def _docker_ok() -> bool:
    if not os.environ.get("DOCKER_HOST") and not os.path.exists("/var/run/docker.sock"):
        return False
    try:
        import docker

        client = docker.from_env(timeout=2)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


@pytest.fixture(scope="session")
def infra_workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="dataplane-test-") as d:
        yield Path(d)


@pytest.fixture(scope="session")
def docker_ok() -> bool:
    return _docker_ok()


@pytest.fixture(scope="session")
def postgres_url(infra_workdir: Path, docker_ok: bool) -> Iterator[str]:
    """A PostgreSQL server URL (postgresql://…, asyncpg style, no driver suffix)."""
    if url := os.environ.get("TEST_DATABASE_URL"):
        SERVICE_MODES["postgres"] = "env"
        yield url
        return
    if docker_ok:
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("postgres:16-alpine", driver=None) as pg:
            SERVICE_MODES["postgres"] = "testcontainers"
            yield pg.get_connection_url()
            return
    srv = infra.start_postgres(infra_workdir / "pg")
    SERVICE_MODES["postgres"] = "embedded"
    yield srv.url
    srv.stop()


@pytest.fixture(scope="session")
def redis_server_url(infra_workdir: Path, docker_ok: bool) -> Iterator[str]:
    if url := os.environ.get("TEST_REDIS_URL"):
        SERVICE_MODES["redis"] = "env"
        yield url
        return
    if docker_ok:
        from testcontainers.redis import RedisContainer

        with RedisContainer() as r:
            SERVICE_MODES["redis"] = "testcontainers"
            yield f"redis://{r.get_container_host_ip()}:{r.get_exposed_port(6379)}/0"
            return
    srv = infra.start_redis(infra_workdir / "redis")
    SERVICE_MODES["redis"] = "embedded"
    yield srv.url
    srv.stop()


@pytest.fixture(scope="session")
def kafka_bootstrap(infra_workdir: Path, docker_ok: bool) -> Iterator[str]:
    if bs := os.environ.get("TEST_KAFKA_BOOTSTRAP"):
        SERVICE_MODES["kafka"] = "env"
        yield bs
        return
    if docker_ok:
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer() as k:
            SERVICE_MODES["kafka"] = "testcontainers"
            yield k.get_bootstrap_server()
            return
    srv = infra.start_kafka(infra_workdir / "kafka")
    SERVICE_MODES["kafka"] = "embedded"
    yield srv.url
    srv.stop()


@pytest.fixture
async def fresh_database(postgres_url: str) -> AsyncIterator[str]:
    """A new, empty database on the session server for one test; dropped afterwards."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    admin = await asyncpg.connect(postgres_url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    base, _, _ = postgres_url.rpartition("/")
    yield f"{base}/{name}"
    admin = await asyncpg.connect(postgres_url)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


_redis_db_counter = iter(range(1, 16))


@pytest.fixture
async def redis_url(redis_server_url: str) -> AsyncIterator[str]:
    """A flushed Redis logical database for one test (db 1..15 in rotation)."""
    db = next(_redis_db_counter, None)
    if db is None:
        globals()["_redis_db_counter"] = iter(range(2, 16))
        db = 1
    base = redis_server_url.rsplit("/", 1)[0]
    url = f"{base}/{db}"
    client = aioredis.from_url(url)
    await client.flushdb()
    await client.aclose()
    yield url


@pytest.fixture
def unique() -> str:
    """A unique suffix for topics, correlation ids and names in one test."""
    return uuid.uuid4().hex[:12]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if SERVICE_MODES:
        terminalreporter.write_line(f"service modes: {SERVICE_MODES}")
