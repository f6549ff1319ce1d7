"""Issue 18, "faults, told the truth", on the query-gateway (driven in-process, against real
PostgreSQL, Valkey and Tansu servers, the ds connector double as a real HTTP server):

- backends terminated (`pg_terminate_backend`) again and again under concurrent load: every
  answer is a 200 or a coded error, never a bare 500;
- PostgreSQL stopped (SIGSTOP of a scratch server's postmaster and backends): every request is
  answered 503 database_unavailable while the server is still stopped, and /readyz names it;
- the broker paused (SIGSTOP of the test's own Tansu): /readyz turns 503 naming kafka, and back;
- Redis stopped: the gateway stays ready (`degraded: ["redis"]`), serves what needs no lookup,
  and refuses a lookup miss with 503 row_filter_unavailable;
- the keep-alive race: a server that closes connections idle for its own timeout never meets a
  reused connection (the gateway's expiry is below it), and a question sent on a connection the
  server is closing is asked once more, on a fresh one.

Every process a test starts is stopped, and every paused one resumed, in `finally`."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx

from dataplane_contracts.topics import topic_specs
from dataplane_local import infra
from dataplane_local.doubles.ds_connector import DsConnectorDouble
from dataplane_local.procs import paused
from dataplane_local.timeouts import scaled
from dataplane_service_kit.topics_cli import create_topics
from dataplane_testing.databases import scratch_database
from dataplane_testing.faults import PipeProxy, TcpProxy, coded, raw_client
from dataplane_testing.gateway import AGREEMENT, PUBLIC_PEM, SEED, World, ds_policy, grant, pull_token
from dataplane_testing.polling import wait_for
from query_gateway.app import create_app
from query_gateway.settings import Settings

STATS = {"sql": "SELECT id, label FROM stats ORDER BY id"}


@contextlib.asynccontextmanager
async def gateway(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings)
    async with app.router.lifespan_context(app), raw_client(app) as client:
        yield client


async def readyz(client: httpx.AsyncClient) -> tuple[int, dict[str, Any]]:
    r = await client.get("/readyz")
    return r.status_code, r.json()


# ---------------------------------------------------------------------------- database
async def test_issue18_backends_terminated_under_load_answer_200_or_a_code(
    world: World, postgres_url: str
) -> None:
    async with scratch_database(postgres_url, SEED) as url:
        name = url.rpartition("/")[2]
        # eight workers of one (anonymous) caller: QE-10's share, tested on its own, set above them
        settings = world.settings(
            datasets_database_url=url,
            datasets_pool_max_size=4,
            query_max_concurrent_per_consumer=8,
            query_max_concurrent_per_consumer_total=8,
        )
        answers: list[httpx.Response] = []
        async with gateway(settings) as client:
            stop = asyncio.Event()

            async def load() -> None:
                while not stop.is_set():
                    answers.append(await client.post("/query", json=STATS))

            workers = [asyncio.create_task(load()) for _ in range(8)]
            admin = await asyncpg.connect(postgres_url)
            killed = 0
            try:
                for _ in range(8):
                    await asyncio.sleep(0.25)  # spacing between rounds, not a limit
                    killed += await admin.fetchval(
                        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                        " WHERE datname = $1 AND pid <> pg_backend_pid()) t",
                        name,
                    )
            finally:
                stop.set()
                await asyncio.gather(*workers, return_exceptions=True)
                await admin.close()
            assert killed >= 8
            codes = Counter(coded(r) for r in answers)  # fails on any bare 500
            assert set(codes) <= {(200, "ok"), (503, "database_unavailable")}, codes
            assert codes[(200, "ok")] > 0, codes
            # and the pool heals: once the terminations stop, the next answers are rows
            await wait_for(lambda: _ok(client.post("/query", json=STATS)), 30, "a 200 after the terminations")


async def _ok(pending: Any) -> bool:
    response: httpx.Response = await pending
    return response.status_code == 200


async def test_issue18_database_stopped_every_request_answers_within_its_bound_with_a_code(
    world: World, tmp_path: Path
) -> None:
    pg = infra.start_postgres(tmp_path / "pg")
    try:
        admin = await asyncpg.connect(pg.url)
        await admin.execute('CREATE DATABASE "ds"')
        await admin.close()
        url = pg.url.rpartition("/")[0] + "/ds"
        conn = await asyncpg.connect(url)
        await conn.execute(SEED)
        await conn.close()
        settings = world.settings(
            datasets_database_url=url,
            datasets_pool_max_size=2,
            query_statement_timeout_ms=500,
            database_acquire_timeout_ms=1000,
            database_command_timeout_ms=1500,
            query_max_concurrent_per_consumer=6,
            query_max_concurrent_per_consumer_total=6,  # six at once below, every one waiting on the pool
        )
        async with gateway(settings) as client:
            assert (await client.post("/query", json=STATS)).status_code == 200
            with paused(pg.pid):
                started = time.monotonic()
                # more requests than pooled connections: some wait for a connection, some hold one
                answers = await asyncio.wait_for(
                    asyncio.gather(*(client.post("/query", json=STATS) for _ in range(6))), scaled(60)
                )
                elapsed = time.monotonic() - started
                # answered while PostgreSQL is still stopped: the bound is the gateway's own
                assert [coded(r) for r in answers] == [(503, "database_unavailable")] * 6, elapsed
                assert all("SELECT" not in r.json()["detail"] for r in answers)
                # a kept answer (1.5 s, docs/faults.md, `/readyz`) may still say ready: asked again
                await wait_for(lambda: _names(readyz(client), "datasets_db"), 30, "unready")
            await wait_for(lambda: _ok(client.post("/query", json=STATS)), 60, "rows after SIGCONT")
            # the unready answer may still be kept for its 1.5 s: asked until whole
            await wait_for(lambda: _is_whole(readyz(client)), 30, "ready after SIGCONT")
    finally:
        pg.stop()


# ---------------------------------------------------------------------------- broker
async def test_issue18_broker_paused_readyz_names_kafka_and_returns(world: World, tmp_path: Path) -> None:
    from dataplane_testing.resolver import resolver_beside
    from filter_resolver.app import create_app as resolver_app

    kafka = infra.start_kafka(tmp_path / "kafka")
    try:
        os.environ.setdefault("KAFKA_REPLICATION_FACTOR", "1")
        await create_topics(kafka.url, topic_specs())
        resolver = resolver_app(resolver_beside(kafka.url, world.redis_url, "issue18"))
        settings = world.settings(kafka_bootstrap_servers=kafka.url)
        async with (
            gateway(settings) as gw,
            gateway(settings) as gw2,  # both replicas, each on its own reply partition
            resolver.router.lifespan_context(resolver),
            raw_client(resolver) as rs,
        ):
            parts = (("gateway 1", gw), ("gateway 2", gw2), ("resolver", rs))
            for name, client in parts:
                await wait_for(lambda c=client: _is(readyz(c), 200), 60, f"{name} ready")
            with paused(kafka.pid):
                for name, client in parts:
                    await wait_for(lambda c=client: _names_kafka(readyz(c)), 30, f"{name} unready")
            for name, client in parts:
                await wait_for(lambda c=client: _is(readyz(c), 200), 60, f"{name} ready again")
    finally:
        kafka.stop()


async def _is(pending: Any, status: int) -> bool:
    got, _ = await pending
    return bool(got == status)


async def _names_kafka(pending: Any) -> bool:
    return await _names(pending, "kafka")


async def _names(pending: Any, dependency: str) -> bool:
    status, body = await pending
    return bool(status == 503 and dependency in body.get("failing", []))


# ---------------------------------------------------------------------------- redis
async def test_issue18_redis_stopped_the_gateway_stays_ready_and_refuses_lookup_misses(
    world: World, tmp_path: Path
) -> None:
    redis = infra.start_redis(tmp_path / "redis")
    try:
        settings = world.settings(redis_url=redis.url, redis_socket_timeout_seconds=1.0)
        async with gateway(settings) as client:
            await wait_for(lambda: _is(readyz(client), 200), 60, "ready")
            user = {"Authorization": f"Bearer {world.user_token('user-1')}"}
            with paused(redis.pid):
                # a kept answer (1.5 s, docs/faults.md, `/readyz`) may still say whole: asked again
                await wait_for(lambda: _degraded(readyz(client), "redis"), 30, "degraded")
                status, body = await readyz(client)
                assert (status, body) == (200, {"status": "ready", "degraded": ["redis"]})
                metrics = (await client.get("/metrics")).text
                assert 'readiness_dependency_up{dependency="redis",required="false"} 0.0' in metrics
                # no lookup needed: served
                notes = await client.post(
                    "/query", json={"sql": "SELECT id FROM notes ORDER BY id"}, headers=user
                )
                assert notes.status_code == 200 and [r["id"] for r in notes.json()["items"]] == [1, 3]
                # a lookup handler's plan is not held in-process: refused with its code
                miss = await client.post("/query", json={"sql": "SELECT id FROM registry"}, headers=user)
                assert coded(miss) == (503, "row_filter_unavailable")
            await wait_for(lambda: _is_whole(readyz(client)), 30, "no longer degraded")
    finally:
        redis.stop()


async def _is_whole(pending: Any) -> bool:
    return bool(await pending == (200, {"status": "ready"}))


# ---------------------------------------------------------------------------- flows database
async def _degraded(pending: Any, named: str) -> bool:
    status, body = await pending
    return bool(status == 200 and named in body.get("degraded", []))


async def test_issue18_flows_database_refusing_keeps_the_gateway_ready_for_edr(
    world: World, ds: DsConnectorDouble, flows_url: str
) -> None:
    """The flows database is needed only by DPS pulls: when it refuses, the replica stays in the
    Service (`degraded: [flows_db]`), a pull is `503 database_unavailable`, EDR is served."""
    ds.set_policy(ds_policy([{"dataset_id": "stats", "row_filter": None}]))
    target = urlsplit(flows_url)
    proxy = PipeProxy(target.port or 5432)
    await proxy.__aenter__()
    open_ = True
    try:
        netloc = target.netloc.replace(f":{target.port}", f":{proxy.port}")
        through = urlunsplit(target._replace(netloc=netloc))
        settings = world.settings(
            dps_enabled=True, dps_token_public_key=PUBLIC_PEM, dps_flows_database_url=through
        )
        async with gateway(settings) as client:
            await wait_for(lambda: _is(readyz(client), 200), 60, "ready")
            token = {"Authorization": f"Bearer {pull_token(await grant(flows_url))}"}
            assert (await client.post("/dps/public/query", json=STATS, headers=token)).status_code == 200
            await proxy.__aexit__(None, None, None)  # connections dropped, new ones refused
            open_ = False
            await wait_for(lambda: _degraded(readyz(client), "flows_db"), 30, "degraded")
            pulled = await client.post("/dps/public/query", json=STATS, headers=token)
            assert coded(pulled) == (503, "database_unavailable")
            edr = await client.post("/query", json=STATS, headers=_edr(world))
            assert edr.status_code == 200, edr.text
            assert [r["id"] for r in edr.json()["items"]]
    finally:
        if open_:
            await proxy.__aexit__(None, None, None)


# ---------------------------------------------------------------------------- keep-alive
class IdleClosingProxy(TcpProxy):
    """In front of a real HTTP server, acting as a server whose idle timeout is `idle_s`: a
    connection idle that long is closed when it is next used, before its request is forwarded —
    the server's close crossing the client's request, made deterministic."""

    def __init__(self, upstream_port: int, idle_s: float) -> None:
        super().__init__(upstream_port)
        self.idle_s = idle_s
        self.dropped = 0
        self.connections = 0

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.connections += 1
        upstream_r, upstream_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        last = [time.monotonic()]

        async def answers() -> None:
            with contextlib.suppress(ConnectionError):
                while data := await upstream_r.read(65536):
                    client_w.write(data)
                    await client_w.drain()
                    last[0] = time.monotonic()
            client_w.close()

        self._spawn(answers())
        try:
            while data := await client_r.read(65536):
                if time.monotonic() - last[0] >= self.idle_s:
                    self.dropped += 1  # closed without an answer, as at the server's idle timeout
                    break
                upstream_w.write(data)
                await upstream_w.drain()
                last[0] = time.monotonic()
        except ConnectionError:
            pass
        finally:
            upstream_w.close()
            client_w.close()


def _edr(world: World) -> dict[str, str]:
    return {
        "Authorization": f"Bearer {world.edr()}",
        "Edc-Contract-Agreement-Id": AGREEMENT,
        "Edc-Transfer-Process-Id": "tp-1",
    }


@contextlib.asynccontextmanager
async def _behind_idle_closing_ds(
    world: World, ds: DsConnectorDouble, keepalive_expiry_s: float
) -> AsyncIterator[tuple[IdleClosingProxy, httpx.AsyncClient]]:
    """A gateway asking ds through a server that closes connections idle for 1 s, every
    question asked anew (no decision cache)."""
    ds.set_policy(ds_policy([{"dataset_id": "stats", "row_filter": None}]))
    port = int(world.ds_url.rsplit(":", 1)[1])
    async with IdleClosingProxy(port, idle_s=1.0) as proxy:
        settings = world.settings(
            connector_internal_url=proxy.url,
            connector_keepalive_expiry_seconds=keepalive_expiry_s,
            ds_decision_cache_enabled=False,
        )
        async with gateway(settings) as client:
            yield proxy, client


async def test_issue18_the_gateway_drops_idle_ds_connections_before_ds_does(
    world: World, ds: DsConnectorDouble
) -> None:
    async with _behind_idle_closing_ds(world, ds, keepalive_expiry_s=0.5) as (proxy, client):
        for _ in range(3):
            r = await client.post("/query", json=STATS, headers=_edr(world))
            assert r.status_code == 200, r.text
            await asyncio.sleep(1.2)  # past the server's idle timeout: the idle gap itself
    assert proxy.dropped == 0
    assert len(ds.calls("authorize")) == 3


async def test_issue18_a_question_on_a_connection_ds_is_closing_is_asked_once_more(
    world: World, ds: DsConnectorDouble
) -> None:
    # an expiry above the server's idle timeout: the race the defaults avoid, provoked
    async with _behind_idle_closing_ds(world, ds, keepalive_expiry_s=30) as (proxy, client):
        first = await client.post("/query", json=STATS, headers=_edr(world))
        assert first.status_code == 200, first.text
        await asyncio.sleep(1.2)  # the idle gap the server closes at
        again = await client.post("/query", json=STATS, headers=_edr(world))
        assert again.status_code == 200, again.text
    assert proxy.dropped >= 1
    assert len(ds.calls("authorize")) == 2  # the dropped question never reached ds
