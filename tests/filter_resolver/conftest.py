"""Fixtures: the OIDC issuer, REC registry and http_in_list doubles (real HTTP servers, once per
session), and a resolver runtime per test on a flushed Redis database."""

from __future__ import annotations

import gc
import logging
import warnings
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from redis.asyncio import Redis

from dataplane_contracts.events import PlanResolved
from dataplane_contracts.plans import ClaimCheck, Plan
from dataplane_local.doubles.oidc import JWKS_PATH, OidcIssuer, start_oidc_issuer
from dataplane_local.doubles.rec_registry import RecRegistryDouble
from dataplane_local.doubles.rec_registry import create_app as registry_app
from dataplane_local.doubles.server import RunningServer, serve_in_thread
from dataplane_service_kit.logs import configure_logging
from dataplane_testing.resolver import (
    CLIENT_ID,
    CLIENT_SECRET,
    LOOKUP_SCOPE,
    ListEndpoint,
    make_settings,
    put_claim,
    read_plan,
)
from filter_resolver.app import Runtime, open_runtime
from filter_resolver.handlers.plugins import PluginHandler
from filter_resolver.metrics import Metrics


@dataclass
class Doubles:
    issuer: OidcIssuer
    registry: RecRegistryDouble
    registry_url: str
    endpoint: ListEndpoint
    endpoint_url: str


@pytest.fixture(scope="session")
def doubles() -> Iterator[Doubles]:
    issuer, issuer_server = start_oidc_issuer(clients={CLIENT_ID: CLIENT_SECRET})
    registry = RecRegistryDouble()
    registry_config = {"jwks_url": issuer.base_url + JWKS_PATH, "admin_required_scope": LOOKUP_SCOPE}
    registry.configure(registry_config)
    registry_server = serve_in_thread(registry_app(registry))
    endpoint = ListEndpoint()
    endpoint_server = serve_in_thread(endpoint.app())
    servers: list[RunningServer] = [issuer_server, registry_server, endpoint_server]
    yield Doubles(issuer, registry, registry_server.url, endpoint, endpoint_server.url)
    for server in servers:
        server.stop()


@pytest.fixture
def fresh_doubles(doubles: Doubles) -> Doubles:
    """Doubles with no members, faults or recorded calls left by another test."""
    doubles.registry.configure(
        {
            "jwks_url": doubles.issuer.base_url + "/protocol/openid-connect/certs",
            "admin_required_scope": LOOKUP_SCOPE,
        }
    )
    doubles.registry.clear_faults()
    doubles.registry.clear_calls()
    doubles.endpoint.reset()
    return doubles


@dataclass
class Harness:
    """The resolver in-process, over real Redis and the doubles; `resolve` does the gateway's part."""

    runtime: Runtime
    redis: Redis
    metrics: Metrics

    async def resolve(self, check: ClaimCheck, **request_fields: Any) -> PlanResolved:
        request = await put_claim(self.redis, check, **request_fields)
        return await self.runtime.resolver.process(request)

    async def plan(self, check: ClaimCheck) -> Plan:
        reply = await self.resolve(check)
        assert reply.outcome != "error", reply
        plan: Plan = await read_plan(self.redis, reply)
        return plan


async def _harness(
    redis_url: str, doubles: Doubles, plugins: list[PluginHandler] | None = None, **overrides: Any
) -> AsyncIterator[Harness]:
    settings = make_settings(
        redis_url=redis_url,
        rec_registry_url=doubles.registry_url,
        celine_oidc_base_url=doubles.issuer.base_url,
        **overrides,
    )
    metrics = Metrics()
    runtime = open_runtime(settings, metrics, plugins or [])
    redis = Redis.from_url(redis_url)
    try:
        yield Harness(runtime, redis, metrics)
    finally:
        await redis.aclose()
        await runtime.aclose()


@pytest.fixture
async def harness(redis_url: str, fresh_doubles: Doubles) -> AsyncIterator[Harness]:
    async for h in _harness(redis_url, fresh_doubles):
        yield h


@pytest.fixture
def make_harness(redis_url: str, fresh_doubles: Doubles) -> Any:
    """A harness with plugins or other settings: `async with make_harness(plugins=[...]) as h`."""
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def factory(plugins: list[PluginHandler] | None = None, **overrides: Any) -> AsyncIterator[Harness]:
        async for h in _harness(redis_url, fresh_doubles, plugins, **overrides):
            yield h

    return factory


@pytest.fixture
def debug_logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """The service's JSON logging at DEBUG, captured."""
    configure_logging("filter-resolver", "DEBUG")
    caplog.set_level(logging.DEBUG)
    return caplog


@pytest.fixture(autouse=True)
def _collect_sdk_clients() -> Iterator[None]:
    """celine-sdk's RecRegistryUserClient builds an httpx client per call and never closes it
    (no public way to), so its sockets are closed by the garbage collector with a ResourceWarning.
    Collect them here, where that warning is expected, rather than at a random later point where
    `filterwarnings = error` turns it into an error inside a finalizer."""
    yield
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()
