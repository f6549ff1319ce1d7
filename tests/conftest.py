"""Real infrastructure for every test: PostgreSQL, Redis and a Kafka-protocol broker.

Tiers, in order: `TEST_DATABASE_URL` / `TEST_REDIS_URL` / `TEST_KAFKA_BOOTSTRAP` when set; a
testcontainers server when a Docker engine answers; otherwise the embedded servers of
`dataplane_local.infra`, started once per test session on loopback.

`DATAPLANE_TEST_TIMEOUT_FACTOR` (dataplane_local.timeouts) scales every wall-clock limit of the
helpers and fixtures, the servers' start-up and pytest-timeout's per-test limit."""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from dataplane_local import infra
from dataplane_local.doubles.did_web import DidWebHost, start_did_web_host
from dataplane_local.stack import PORTS_ENV
from dataplane_local.timeouts import timeout_factor
from dataplane_testing.databases import create_database, drop_database
from dataplane_testing.tls import PROXY_VARIABLES, PrivateCa, private_ca

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


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """pytest-timeout's limit (ini or PYTEST_TIMEOUT) times the factor; `--timeout` given on the
    command line is taken as it is."""
    # every stack a test starts takes free ports, never the developer stack's preferred ones: a
    # second suite (or a bench) running beside this one must not meet this one's services
    os.environ.setdefault(PORTS_ENV, "any")
    factor = timeout_factor()
    if factor != 1 and config.getoption("timeout", None) is None:
        base = os.environ.get("PYTEST_TIMEOUT") or config.getini("timeout")
        if base:
            config.option.timeout = float(base) * factor


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test's own `@pytest.mark.timeout(n)` is scaled by the factor too."""
    factor = timeout_factor()
    if factor == 1:
        return
    for item in items:
        mark = item.get_closest_marker("timeout")
        if mark is not None and mark.args:
            item.add_marker(pytest.mark.timeout(float(mark.args[0]) * factor), append=False)


@pytest.fixture(scope="session")
def infra_workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="dataplane-test-") as d:
        yield Path(d)


@pytest.fixture(scope="session")
def docker_ok() -> bool:
    return _docker_ok()


def _server(
    kind: str,
    env_var: str,
    docker_ok: bool,
    container: Callable[[], AbstractContextManager[str]],
    embedded: Callable[[], infra.ServerProcess],
) -> Iterator[str]:
    """One server URL by the tiers above, recorded in SERVICE_MODES for the summary line."""
    if url := os.environ.get(env_var):
        SERVICE_MODES[kind] = "env"
        yield url
        return
    if docker_ok:
        with container() as url:
            SERVICE_MODES[kind] = "testcontainers"
            yield url
            return
    srv = embedded()
    SERVICE_MODES[kind] = "embedded"
    yield srv.url
    srv.stop()


@contextmanager
def _pg_container() -> Iterator[str]:
    from testcontainers.postgres import PostgresContainer

    with PostgresContainer("postgres:16-alpine", driver=None) as pg:
        yield pg.get_connection_url()


@contextmanager
def _redis_container() -> Iterator[str]:
    from testcontainers.redis import RedisContainer

    with RedisContainer() as r:
        yield f"redis://{r.get_container_host_ip()}:{r.get_exposed_port(6379)}/0"


@contextmanager
def _kafka_container() -> Iterator[str]:
    from testcontainers.kafka import KafkaContainer

    with KafkaContainer() as k:
        yield k.get_bootstrap_server()


@pytest.fixture(scope="session")
def postgres_url(infra_workdir: Path, docker_ok: bool) -> Iterator[str]:
    """A PostgreSQL server URL (postgresql://…, asyncpg style, no driver suffix)."""
    yield from _server(
        "postgres",
        "TEST_DATABASE_URL",
        docker_ok,
        _pg_container,
        lambda: infra.start_postgres(infra_workdir / "pg"),
    )


@pytest.fixture(scope="session")
def redis_server_url(infra_workdir: Path, docker_ok: bool) -> Iterator[str]:
    yield from _server(
        "redis",
        "TEST_REDIS_URL",
        docker_ok,
        _redis_container,
        lambda: infra.start_redis(infra_workdir / "redis"),
    )


@pytest.fixture(scope="session")
def kafka_bootstrap(infra_workdir: Path, docker_ok: bool) -> Iterator[str]:
    yield from _server(
        "kafka",
        "TEST_KAFKA_BOOTSTRAP",
        docker_ok,
        _kafka_container,
        lambda: infra.start_kafka(infra_workdir / "kafka"),
    )


@pytest.fixture
async def fresh_database(postgres_url: str) -> AsyncIterator[str]:
    """A new, empty database on the session server for one test; dropped afterwards."""
    url = await create_database(postgres_url)
    yield url
    await drop_database(postgres_url, url)


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
def did_host() -> Iterator[DidWebHost]:
    """A did:web host double (did documents over plain HTTP) for one test."""
    host, server = start_did_web_host()
    yield host
    server.stop()


@pytest.fixture
def unique() -> str:
    """A unique suffix for topics, correlation ids and names in one test."""
    return uuid.uuid4().hex[:12]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if SERVICE_MODES:
        terminalreporter.write_line(f"service modes: {SERVICE_MODES}")


@pytest.fixture(scope="session")
def private_ca_files(tmp_path_factory: pytest.TempPathFactory) -> PrivateCa:
    """A CA made for this run and a server certificate it signed (dataplane_testing.tls)."""
    return private_ca(tmp_path_factory.mktemp("private-ca"))


@pytest.fixture
def plain_trust_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No proxy variable and no SSL_CERT_FILE from the machine: a trust or proxy test sets exactly
    the variables it is about."""
    for name in PROXY_VARIABLES:
        for spelling in (name, name.lower()):
            monkeypatch.delenv(spelling, raising=False)
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
