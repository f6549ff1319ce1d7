"""Readiness and the gateway's two caches (issue 5):

- the gateway is ready only once its reply partition is positioned: with no broker listening it
  never starts; with a broker that has not yet answered the reply consumer's offset lookup (a TCP
  proxy holds it), /readyz is 503, and 200 once the answer arrives and the partition is positioned;
- the in-process plan tier holds at most ROW_FILTERS_CACHE_MAXSIZE plans, oldest evicted first
  (seen through the resolver double: an evicted plan, gone from Redis too, is requested again);
- the issuer's JWKS is fetched once for many tokens of a known kid, concurrent first uses included.

A gateway is driven in-process (its lifespan, then ASGI requests), against real PostgreSQL, Redis
and Kafka-protocol brokers and the OIDC issuer double as a real HTTP server."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiokafka.errors import KafkaError

from dataplane_contracts.topics import topic_specs
from dataplane_local import infra
from dataplane_local.doubles.oidc import start_oidc_issuer
from dataplane_service_kit.topics_cli import create_topics
from dataplane_testing.faults import TcpProxy, pipe
from dataplane_testing.gateway import (
    AUDIENCE,
    CLIENT_ID,
    CLIENT_SECRET,
    FakeResolver,
    World,
    flush_plan_cache,
    running_gateway,
)
from dataplane_testing.metrics import scrape
from dataplane_testing.metrics import series as metric
from query_gateway.app import create_app

STARTING = {"status": "unready", "error": "not_ready", "failing": ["startup"]}


async def _readyz(client: httpx.AsyncClient) -> tuple[int, Any]:
    response = await client.get("/readyz")
    return response.status_code, response.json()


async def _event_or_end(event: asyncio.Event, task: asyncio.Task[None], timeout: float) -> bool:
    """Wait until `event` is set or `task` ends (the timeout only bounds a hang); is it set?"""
    waiter = asyncio.create_task(event.wait())
    try:
        await asyncio.wait({waiter, task}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiter
    return event.is_set()


# ---------------------------------------------------------------------------- readiness
async def test_with_no_broker_listening_the_gateway_never_becomes_ready(world: World) -> None:
    app = create_app(world.settings(kafka_bootstrap_servers=f"127.0.0.1:{infra.free_port()}"))
    transport = httpx.ASGITransport(app=app)  # requests only: the lifespan is entered below
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
        assert await _readyz(client) == (503, STARTING)
        with pytest.raises(KafkaError):  # the start refuses; it never serves degraded
            async with app.router.lifespan_context(app):
                pytest.fail("the gateway started without a broker")
        assert await _readyz(client) == (503, STARTING)


LIST_OFFSETS = 2  # the Kafka API key a consumer uses to find a partition's end offset


class HoldingProxy(TcpProxy):
    """A TCP proxy in front of a broker that holds every ListOffsets request until released.

    The gateway's reply consumer positions its partition with ListOffsets (seek to the end); its
    producer never sends one. So while the proxy holds, the gateway has reached the broker but its
    reply partition is not positioned. Requests are parsed by their Kafka frame (int32 size, then
    int16 api key); everything else, and every response, passes through unchanged."""

    def __init__(self, upstream_port: int) -> None:
        super().__init__(upstream_port)
        self.held = asyncio.Event()
        self.released = asyncio.Event()

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        upstream_r, upstream_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        self._spawn(self._requests(client_r, upstream_w))
        self._spawn(pipe(upstream_r, client_w))

    async def _requests(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                size = await reader.readexactly(4)
                body = await reader.readexactly(int.from_bytes(size, "big"))
                if int.from_bytes(body[:2], "big") == LIST_OFFSETS and not self.released.is_set():
                    self.held.set()
                    await self.released.wait()
                writer.write(size + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def _start_broker_behind(workdir: Path, listen_port: int, advertised_port: int) -> infra.ServerProcess:
    """A Tansu broker of this test's own that tells clients to connect through the proxy."""
    workdir.mkdir(parents=True, exist_ok=True)
    cmd = [
        str(infra.tansu_binary()),
        "broker",
        "--listener-url",
        f"tcp://127.0.0.1:{listen_port}",
        "--advertised-listener-url",
        f"tcp://127.0.0.1:{advertised_port}",
    ]
    with (workdir / "tansu.log").open("ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=log, cwd=workdir, start_new_session=True)
    infra.wait_port(listen_port)
    return infra.ServerProcess("kafka", f"127.0.0.1:{listen_port}", proc.pid, None, workdir)


async def test_readyz_is_503_until_the_reply_partition_is_positioned(world: World, tmp_path: Path) -> None:
    broker_port = infra.free_port()
    async with HoldingProxy(broker_port) as proxy:
        broker = _start_broker_behind(tmp_path / "kafka", broker_port, proxy.port)
        lifespan: asyncio.Task[None] | None = None
        try:
            await create_topics(f"127.0.0.1:{proxy.port}", topic_specs())
            app = create_app(world.settings(kafka_bootstrap_servers=f"127.0.0.1:{proxy.port}"))
            started, stop = asyncio.Event(), asyncio.Event()

            async def run() -> None:
                async with app.router.lifespan_context(app):
                    started.set()
                    await stop.wait()

            lifespan = asyncio.create_task(run())
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
                # the gateway is connected and positioning its reply partition: not ready
                held = await _event_or_end(proxy.held, lifespan, timeout=60)
                assert held, lifespan.exception() if lifespan.done() else None
                assert not started.is_set()
                for _ in range(3):
                    assert await _readyz(client) == (503, STARTING)

                # the broker answers: the partition is positioned, the gateway is ready
                proxy.released.set()
                ready = await _event_or_end(started, lifespan, timeout=60)
                assert ready, lifespan.exception() if lifespan.done() else None
                assert await _readyz(client) == (200, {"status": "ready"})

                stop.set()
                await asyncio.wait_for(lifespan, 30)
                assert await _readyz(client) == (503, STARTING)  # stopped: no longer ready
        finally:
            proxy.released.set()
            if lifespan is not None and not lifespan.done():
                lifespan.cancel()
                with contextlib.suppress(BaseException):
                    await lifespan
            broker.stop()


# ---------------------------------------------------------------------------- plan tier bound
async def _query_registry(client: httpx.AsyncClient, token: str) -> None:
    r = await client.post(
        "/query", json={"sql": "SELECT id FROM registry"}, headers={"Authorization": f"Bearer {token}"}
    )
    assert r.status_code == 200, r.text


async def test_the_in_process_plan_tier_holds_at_most_maxsize_plans(
    world: World, flushed: FakeResolver
) -> None:
    # five callers, five plans (the cache key names the caller's sub); the tier holds two
    tokens = [world.user_token(f"lru-{i}") for i in range(5)]
    async with running_gateway(world.settings(row_filters_cache_maxsize=2)) as client:
        for token in tokens:
            await _query_registry(client, token)
        assert len(flushed.requests) == 5
        # the shared Redis tier is emptied: what is not held in-process must be requested again
        await flush_plan_cache(world)
        before = await scrape(client)

        # the two newest plans are held: no request
        await _query_registry(client, tokens[4])
        await _query_registry(client, tokens[3])
        assert len(flushed.requests) == 5
        # the three oldest were evicted: each is requested again, exactly once
        for n, token in enumerate(tokens[:3], start=1):
            await _query_registry(client, token)
            assert len(flushed.requests) == 5 + n
        after = await scrape(client)
        hits = metric(after, "query_gateway_plan_cache_total", result="hit")
        misses = metric(after, "query_gateway_plan_cache_total", result="miss")
        assert hits - metric(before, "query_gateway_plan_cache_total", result="hit") == 2
        assert misses - metric(before, "query_gateway_plan_cache_total", result="miss") == 3

        # the bound held throughout: after those three, only the newest two are in-process
        await flush_plan_cache(world)
        await _query_registry(client, tokens[2])
        await _query_registry(client, tokens[1])
        assert len(flushed.requests) == 8
        await _query_registry(client, tokens[0])  # pushed out by tokens[1] and tokens[2]
        assert len(flushed.requests) == 9


# ---------------------------------------------------------------------------- JWKS cache
@contextlib.asynccontextmanager
async def _own_issuer_gateway(world: World) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    """A gateway trusting an issuer of its own, so only this gateway's JWKS fetches are counted."""
    issuer, server = start_oidc_issuer(clients={CLIENT_ID: CLIENT_SECRET})
    try:
        # eight concurrent first uses of one user: past QE-10's default share, tested on its own
        settings = world.settings(
            celine_oidc_base_url=issuer.base_url,
            query_max_concurrent_per_consumer=8,
            query_max_concurrent_per_consumer_total=8,
        )
        async with running_gateway(settings) as client:
            yield issuer, client
    finally:
        server.stop()


async def test_jwks_is_fetched_once_for_many_tokens_of_a_known_kid(world: World) -> None:
    async with _own_issuer_gateway(world) as (issuer, client):
        assert issuer.jwks_requests == 0  # fetched lazily, not at start-up

        async def notes_of(sub: str) -> list[int]:
            token = issuer.mint({"sub": sub, "preferred_username": f"name-of-{sub}"}, audience=AUDIENCE)
            r = await client.post(
                "/query",
                json={"sql": "SELECT id FROM notes ORDER BY id"},
                headers={"Authorization": f"Bearer {token}"},
            )
            assert r.status_code == 200, r.text
            return [row["id"] for row in r.json()["items"]]

        # concurrent first uses on a cold cache share one fetch
        first = await asyncio.gather(*(notes_of("user-1") for _ in range(8)))
        assert first == [[1, 3]] * 8
        assert issuer.jwks_requests == 1
        # then many more tokens, other callers too, all of the same kid: no further fetch
        for i in range(12):
            assert await notes_of(f"user-{1 + i % 2}") == ([1, 3] if i % 2 == 0 else [2])
        assert issuer.jwks_requests == 1
