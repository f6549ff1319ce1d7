"""query-gateway fixtures: a seeded datasets database, the OIDC issuer and ds connector doubles as
real HTTP servers, the session broker with every topic, and the gateway app in-process."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from dataplane_contracts.topics import AUDIT_DISCLOSURES, topic_specs
from dataplane_local.doubles.ds_connector import DsConnectorDouble
from dataplane_local.doubles.ds_connector import create_app as ds_app
from dataplane_local.doubles.oidc import JWKS_PATH, OidcIssuer, start_oidc_issuer
from dataplane_local.doubles.server import RunningServer, serve_in_thread
from dataplane_service_kit.logs import configure_logging
from dataplane_service_kit.topics_cli import create_topics
from dataplane_testing.databases import scratch_database
from dataplane_testing.gateway import (
    CLIENT_ID,
    CLIENT_SECRET,
    PUBLIC_PEM,
    PULL_GRANTS_DDL,
    SEED,
    FakeResolver,
    World,
    ds_policy,
    extended_catalogue,
    fake_resolver,
    flush_plan_cache,
    running_gateway,
)
from dataplane_testing.records import RecordsWorld, records_world
from dataplane_testing.topics import TopicTail


@pytest.fixture(scope="session")
def json_logs() -> None:
    configure_logging("query-gateway", "DEBUG")


@pytest.fixture(scope="session")
async def datasets_url(postgres_url: str) -> AsyncIterator[str]:
    async with scratch_database(postgres_url, SEED, "gw_") as url:
        yield url


@pytest.fixture(scope="session")
def oidc() -> Iterator[OidcIssuer]:
    issuer, server = start_oidc_issuer(clients={CLIENT_ID: CLIENT_SECRET})
    yield issuer
    server.stop()


@pytest.fixture(scope="session")
def ds_server(oidc: OidcIssuer) -> Iterator[tuple[DsConnectorDouble, RunningServer]]:
    # the double checks the gateway's client-credentials bearer against the issuer
    state = DsConnectorDouble(ds_policy([]), service_auth={"jwks_url": oidc.base_url + JWKS_PATH})
    server = serve_in_thread(ds_app(state))
    yield state, server
    server.stop()


@pytest.fixture(scope="session")
async def topics(kafka_bootstrap: str) -> str:
    # aiokafka refuses a replication factor of -1 (the contracts CLI default); one broker here
    os.environ.setdefault("KAFKA_REPLICATION_FACTOR", "1")
    await create_topics(kafka_bootstrap, topic_specs())
    return kafka_bootstrap


@pytest.fixture(scope="session")
def world(
    datasets_url: str,
    oidc: OidcIssuer,
    ds_server: tuple[DsConnectorDouble, RunningServer],
    topics: str,
    redis_server_url: str,
    json_logs: None,
) -> World:
    state, server = ds_server
    return World(datasets_url, oidc, state, server.url, topics, redis_server_url)


@pytest.fixture(scope="session")
async def client(world: World) -> AsyncIterator[httpx.AsyncClient]:
    async with running_gateway(world.settings()) as c:
        yield c


@pytest.fixture
def ds(world: World) -> Iterator[DsConnectorDouble]:
    world.ds.clear_faults()
    world.ds.clear_calls()
    yield world.ds
    world.ds.clear_faults()


@pytest.fixture
async def disclosures(world: World) -> AsyncIterator[TopicTail]:
    async with TopicTail(world.kafka, AUDIT_DISCLOSURES) as tail:
        yield tail


@pytest.fixture(scope="session")
async def extended_client(
    world: World, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[httpx.AsyncClient]:
    """A gateway over the shared catalogue plus `EXTRA_DATASETS`."""
    path = extended_catalogue(tmp_path_factory.mktemp("catalogue"))
    async with running_gateway(world.settings(catalogue_path=path)) as c:
        yield c


@pytest.fixture(scope="module")
async def resolver(world: World) -> AsyncIterator[FakeResolver]:
    async with fake_resolver(world) as state:
        yield state


@pytest.fixture
async def flushed(world: World, resolver: FakeResolver) -> FakeResolver:
    """The resolver double with an empty shared plan cache and no recorded requests."""
    await flush_plan_cache(world)
    resolver.reset()
    return resolver


@pytest.fixture(scope="module")
async def flows_url(postgres_url: str) -> AsyncIterator[str]:
    """A flows database holding the pull-grant view in the shape signaling publishes."""
    async with scratch_database(postgres_url, PULL_GRANTS_DDL) as url:
        yield url


@pytest.fixture(scope="module")
async def pull_client(world: World, flows_url: str) -> AsyncIterator[httpx.AsyncClient]:
    """A DPS gateway reading that module's pull grants."""
    settings = world.settings(
        dps_enabled=True, dps_token_public_key=PUBLIC_PEM, dps_flows_database_url=flows_url
    )
    async with running_gateway(settings) as client:
        yield client


@pytest.fixture(scope="module")
async def rw(
    world: World, postgres_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[RecordsWorld]:
    """The records API's world (dataplane_testing.records): signaling and a DPS gateway over one flows
    database, a datasets database of transactions."""
    async with records_world(world, postgres_url, tmp_path_factory.mktemp("records")) as running:
        yield running
