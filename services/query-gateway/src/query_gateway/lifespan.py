"""The gateway's lifespan: what a replica opens, in order, each part closed in reverse within its
bound (dataplane_service_kit.shutdown). Start-up refuses a catalogue that contradicts the
handler table (GS-08) or names a column the database lacks (GS-09), before anything is served."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import redis.asyncio as aioredis
from aiokafka import AIOKafkaProducer
from fastapi import FastAPI

from dataplane_contracts.catalogue import Catalogue
from dataplane_service_kit.health import ReadinessCheck
from dataplane_service_kit.kafka import started_producer
from dataplane_service_kit.logs import get_logger
from dataplane_service_kit.readiness import DEFAULT_PROBE_TIMEOUT_S, CachedProbe
from dataplane_service_kit.redis_clients import opened_redis
from dataplane_service_kit.shutdown import stop_on_exit
from query_gateway.catalogue.load import CatalogueRefused, CheckedCatalogue, check_catalogue, parse_catalogue
from query_gateway.catalogue.reload import watch_catalogue
from query_gateway.clients.concurrency import ConsumerSlots, SharedShare
from query_gateway.clients.connector import ConnectorClient, connector_http, service_tokens
from query_gateway.clients.disclosure import DisclosurePublisher
from query_gateway.clients.identity import OidcVerifier
from query_gateway.clients.plan_client import PlanClient
from query_gateway.clients.pull import PullVerifier
from query_gateway.clients.pull import flows_pool as flows_pool_of
from query_gateway.clients.rate_limit import RateLimiter, default_limit
from query_gateway.metrics import Metrics
from query_gateway.records.cursor import CursorCodec
from query_gateway.records.startup import records_declared
from query_gateway.records.watch import ChangeWatchers
from query_gateway.settings import Settings
from query_gateway.sql import QueryExecutor, datasets_pool
from query_gateway.state import Gateway

log = get_logger("query_gateway")

Stack = contextlib.AsyncExitStack[bool | None]


class StartupRefused(RuntimeError):
    """The configuration or catalogue is wrong; the message names what."""


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: Settings = app.state.settings
    metrics: Metrics = app.state.metrics
    _refuse_early(settings)
    async with contextlib.AsyncExitStack() as stack:
        pool = await _datasets(settings, stack)
        checked = await _checked_catalogue(settings, pool)
        _records_state(app, checked.catalogue, pool, stack)
        redis = opened_redis(settings, stack)
        producer = await started_producer(settings, stack)
        plans = await _plan_client(settings, redis, producer, metrics, stack)
        http = _connector_http(settings, stack)
        flows_pool = await _flows(settings, stack)
        executor = await _executor(settings, pool, metrics)
        slots = _consumer_slots(settings, redis, executor.bound_s, metrics, stack)
        gw = Gateway(
            settings=settings,
            catalogue=checked.catalogue,
            columns=checked.columns,
            executor=executor,
            plans=plans,
            oidc=OidcVerifier(
                http, settings.oidc_jwks_uri(), settings.oidc_issuer(), settings.celine_oidc_audience
            ),
            connector=ConnectorClient(http, settings, service_tokens(http, settings), metrics=metrics),
            slots=slots,
            disclosures=DisclosurePublisher(producer, settings.audit_publish_timeout_ms, metrics),
            pull=_pull_verifier(settings, flows_pool),
            mask_key=checked.mask_key,
            leakproof=checked.leakproof,
            limiter=RateLimiter(
                redis,
                settings.row_filters_cache_key_secret.get_secret_value().encode(),
                default_limit(settings.rate_limit_per_second, settings.rate_limit_burst),
            ),
            metrics=metrics,
        )
        watch_catalogue(app.state, pool, checked, stack, metrics)  # SIGHUP reloads it
        checks, capabilities = _readiness(
            settings, stack, pool=pool, redis=redis, producer=producer, plans=plans, flows_pool=flows_pool
        )
        app.state.gateway = gw
        app.state.checks = checks
        app.state.capabilities = capabilities
        stack.callback(_unready, app.state)  # first of the stops: /readyz says 503 from here on
        log.info(
            "query_gateway_started",
            datasets=len(checked.catalogue.datasets),
            catalogue_digest=checked.digest,
            reply_partition=plans.reply_partition,
        )
        yield


def _refuse_early(settings: Settings) -> None:
    """The database-free checks of the catalogue: a typo is named before any connection opens."""
    try:
        parse_catalogue(settings)
    except CatalogueRefused as exc:
        raise StartupRefused(str(exc)) from None


async def _datasets(settings: Settings, stack: Stack) -> asyncpg.Pool:
    pool = await datasets_pool(
        settings.datasets_database_url,
        statement_timeout_ms=settings.query_statement_timeout_ms,
        max_size=settings.datasets_pool_max_size,
        command_timeout_s=settings.database_command_timeout_s,
        connect_timeout_s=settings.database_acquire_timeout_ms / 1000,
    )
    stop_on_exit(stack, "datasets_pool", pool.close)
    return pool


async def _checked_catalogue(settings: Settings, pool: asyncpg.Pool) -> CheckedCatalogue:
    try:
        return await check_catalogue(settings, pool)
    except CatalogueRefused as exc:  # GS-09 names dataset, filter and column; GS-08, a handler
        raise StartupRefused(str(exc)) from None


def _records_state(app: FastAPI, catalogue: Catalogue, pool: asyncpg.Pool, stack: Stack) -> None:
    """The records routes' cursor codec, and the change sessions' long-poll watchers
    (docs/records.md), closed before the pool: every waiting request answers with what it has
    while the database is still there."""
    app.state.cursor_codec = _cursor_codec(app.state.settings, catalogue)
    app.state.change_watchers = watchers = ChangeWatchers(pool)
    stack.push_async_callback(watchers.close)


def _cursor_codec(settings: Settings, catalogue: Catalogue) -> CursorCodec | None:
    """RECORDS_CURSOR_SECRET, required on a DPS gateway whose catalogue declares records."""
    declared = records_declared(catalogue)
    secret = settings.records_cursor_secret
    if settings.dps_enabled and declared and secret is None:
        raise StartupRefused(f"RECORDS_CURSOR_SECRET is required: dataset {declared[0]} declares records")
    return CursorCodec(secret.get_secret_value().encode()) if secret is not None else None


async def _plan_client(
    settings: Settings, redis: aioredis.Redis, producer: AIOKafkaProducer, metrics: Metrics, stack: Stack
) -> PlanClient:
    plans = PlanClient(settings, redis, producer, metrics)
    await plans.start()
    stop_on_exit(stack, "plan_client", plans.stop)
    return plans


def _connector_http(settings: Settings, stack: Stack) -> httpx.AsyncClient:
    """ds and the issuer's client (query_gateway.clients.connector)."""
    http = connector_http(settings)
    stop_on_exit(stack, "http_client", http.aclose)
    return http


async def _flows(settings: Settings, stack: Stack) -> asyncpg.Pool | None:
    """The flows database's pull-grant view, on a DPS gateway only."""
    if not settings.dps_enabled:
        return None
    assert settings.dps_flows_database_url  # settings
    pool = await flows_pool_of(settings.dps_flows_database_url, settings.dps_grant_timeout_s)
    stop_on_exit(stack, "flows_pool", pool.close)
    return pool


def _pull_verifier(settings: Settings, flows_pool: asyncpg.Pool | None) -> PullVerifier | None:
    if flows_pool is None:
        return None
    assert settings.dps_token_public_key  # settings: required with DPS
    return PullVerifier(settings.dps_token_public_key, flows_pool, timeout_s=settings.dps_grant_timeout_s)


async def _executor(settings: Settings, pool: asyncpg.Pool, metrics: Metrics) -> QueryExecutor:
    executor = QueryExecutor(
        pool,
        settings.query_statement_timeout_ms,
        session_defaults=True,
        acquire_timeout_s=settings.database_acquire_timeout_ms / 1000,
        command_timeout_s=settings.database_command_timeout_s,
        max_plan_cost=settings.query_max_plan_cost,
    )
    if settings.query_plan_cost_calibrate:
        # QE-06: at start-up, like the catalogue's check, on the same database
        per_ms = await executor.calibrate()
        metrics.plan_cost_per_ms.set(per_ms)
        log.info(
            "plan_cost_calibrated", cost_per_ms=round(per_ms, 1), max_plan_cost=round(executor.max_plan_cost)
        )
    return executor


def _consumer_slots(
    settings: Settings, redis: aioredis.Redis, lease_s: float, metrics: Metrics, stack: Stack
) -> ConsumerSlots:
    """QE-10: the replica's share, and the total across replicas as leases in Redis that outlive
    no statement (a lease lasts the longest a request can hold a connection, then a second). The
    leases the replica keeps for a consumer's next statement are given back before Redis closes."""
    total = settings.query_max_concurrent_per_consumer_total
    shared = None
    if total:
        shared = SharedShare(
            redis,
            settings.row_filters_cache_key_secret.get_secret_value().encode(),
            total,
            lease_s + 1,
            metrics.share_uncounted,
        )
        stop_on_exit(stack, "consumer_leases", shared.close)
    return ConsumerSlots(settings.query_max_concurrent_per_consumer, shared)


def _readiness(
    settings: Settings,
    stack: Stack,
    *,
    pool: asyncpg.Pool,
    redis: aioredis.Redis,
    producer: AIOKafkaProducer,
    plans: PlanClient,
    flows_pool: asyncpg.Pool | None,
) -> tuple[dict[str, ReadinessCheck], dict[str, ReadinessCheck]]:
    """(required checks, capabilities) of /readyz.

    docs/faults.md: required = the replica can serve nothing useful without it; a capability's
    loss refuses only its requests (each with its code) and keeps the replica in the Service. The
    datasets database serves every path; the broker every dataspace request (no disclosure, no
    answer); Redis only lookup-filter misses and rate-limited reads (GS-14), flows only pulls."""
    # the broker itself is asked (metadata, answer kept 1.5 s), not a flag set at start
    broker = CachedProbe(producer.client.fetch_all_metadata, name="kafka")
    stop_on_exit(stack, "kafka_probe", broker.aclose)

    async def kafka_ok() -> bool:
        return plans.positioned and await broker()

    async def redis_ok() -> bool:
        return bool(await redis.ping())

    async def db_ok() -> bool:
        return await _pool_answers(pool)

    checks: dict[str, ReadinessCheck] = {"datasets_db": db_ok}
    capabilities: dict[str, ReadinessCheck] = {"redis": redis_ok}
    dataspace = settings.edr_enabled or settings.dps_enabled
    (checks if dataspace else capabilities)["kafka"] = kafka_ok
    if flows_pool is not None:
        fp = flows_pool

        async def flows_ok() -> bool:
            return await _pool_answers(fp)

        capabilities["flows_db"] = flows_ok
    return checks, capabilities


def _unready(state: Any) -> None:
    state.checks = {}
    state.capabilities = {}


async def _pool_answers(pool: asyncpg.Pool) -> bool:
    """SELECT 1 on a pooled connection, acquire and answer within DEFAULT_PROBE_TIMEOUT_S (below
    /readyz's bound). `pool.fetchval(timeout=)` bounded neither the acquire nor its own release:
    a timed-out statement is returned to the pool only once asyncpg's cancel request to the
    server ends, bounded by the command timeout (32 s by default) — against a stopped server,
    the whole of it. A connection that did not answer is terminated instead (no word to the
    server), so the probe ends at its bound and the pool opens a fresh connection later."""
    async with asyncio.timeout(DEFAULT_PROBE_TIMEOUT_S):
        connection = await pool.acquire()
    try:
        async with asyncio.timeout(DEFAULT_PROBE_TIMEOUT_S):
            return bool(await connection.fetchval("SELECT 1"))
    except BaseException:
        connection.terminate()
        raise
    finally:
        await pool.release(connection)
