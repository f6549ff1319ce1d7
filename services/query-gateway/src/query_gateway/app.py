"""The query-gateway FastAPI app: clients created in the lifespan; start-up refuses a catalogue
that contradicts the handler table (GS-08) or names a column the database lacks (GS-09)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping

import asyncpg
import redis.asyncio as aioredis
from aiokafka import AIOKafkaProducer
from fastapi import FastAPI
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from starlette.types import ASGIApp, Receive, Scope, Send

from dataplane_contracts.catalogue import Catalogue
from dataplane_service_kit.docs_ui import serve_docs
from dataplane_service_kit.errors import install_error_handlers
from dataplane_service_kit.health import ReadinessCheck, health_router
from dataplane_service_kit.limits import BodyLimit
from dataplane_service_kit.logs import get_logger
from dataplane_service_kit.openapi import distribution_version, openapi_document
from dataplane_service_kit.readiness import DEFAULT_PROBE_TIMEOUT_S, CachedProbe
from dataplane_service_kit.request_durations import RequestDurations
from dataplane_service_kit.telemetry import FASTAPI_TELEMETRY, ServerSpans
from query_gateway import openapi as api
from query_gateway.catalogue.load import CatalogueRefused, check_catalogue, parse_catalogue
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
from query_gateway.pipeline import QueryBody
from query_gateway.records.cursor import CursorCodec
from query_gateway.records.routes import install_profile_errors, records_router
from query_gateway.records.startup import records_declared
from query_gateway.records.watch import ChangeWatchers
from query_gateway.routes import QueryRoutes, body_refusals, dps_router, query_router
from query_gateway.settings import Settings
from query_gateway.sql import QueryExecutor
from query_gateway.sql.execute import datasets_pool
from query_gateway.state import Gateway

log = get_logger("query_gateway")


class StartupRefused(RuntimeError):
    """The configuration or catalogue is wrong; the message names what."""


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: Settings = app.state.settings
    _refuse_early(settings)
    async with contextlib.AsyncExitStack() as stack:
        pool = await datasets_pool(
            settings.datasets_database_url,
            statement_timeout_ms=settings.query_statement_timeout_ms,
            max_size=settings.datasets_pool_max_size,
            command_timeout_s=settings.database_command_timeout_s,
            connect_timeout_s=settings.database_acquire_timeout_ms / 1000,
        )
        stack.push_async_callback(pool.close)
        try:
            checked = await check_catalogue(settings, pool)
        except CatalogueRefused as exc:  # GS-09 names dataset, filter and column; GS-08, a handler
            raise StartupRefused(str(exc)) from None
        catalogue = checked.catalogue
        _records_state(app, catalogue, pool, stack)
        redis = aioredis.from_url(
            settings.redis_url,
            socket_connect_timeout=settings.redis_connect_timeout_seconds,
            socket_timeout=settings.redis_socket_timeout_seconds,
            # a dropped connection is tried once more; a timeout is not (its bound is the bound)
            retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        )
        stack.push_async_callback(redis.aclose)
        producer = await _started_producer(settings, stack)
        plans = PlanClient(settings, redis, producer, app.state.metrics)
        await plans.start()
        stack.push_async_callback(plans.stop)
        http = connector_http(settings)
        stack.push_async_callback(http.aclose)
        pull = None
        flows_pool: asyncpg.Pool | None = None
        if settings.dps_enabled:
            assert settings.dps_flows_database_url and settings.dps_token_public_key  # settings
            flows_pool = await flows_pool_of(settings.dps_flows_database_url, settings.dps_grant_timeout_s)
            stack.push_async_callback(flows_pool.close)
            pull = PullVerifier(
                settings.dps_token_public_key, flows_pool, timeout_s=settings.dps_grant_timeout_s
            )
        executor = await _executor(settings, pool, app.state.metrics)
        slots = _consumer_slots(settings, redis, executor.bound_s, app.state.metrics, stack)
        gw = Gateway(
            settings=settings,
            catalogue=catalogue,
            columns=checked.columns,
            executor=executor,
            plans=plans,
            oidc=OidcVerifier(
                http, settings.oidc_jwks_uri(), settings.oidc_issuer(), settings.celine_oidc_audience
            ),
            connector=ConnectorClient(
                http, settings, service_tokens(http, settings), metrics=app.state.metrics
            ),
            slots=slots,
            disclosures=DisclosurePublisher(producer, settings.audit_publish_timeout_ms, app.state.metrics),
            pull=pull,
            mask_key=checked.mask_key,
            leakproof=checked.leakproof,
            limiter=RateLimiter(
                redis,
                settings.row_filters_cache_key_secret.get_secret_value().encode(),
                default_limit(settings.rate_limit_per_second, settings.rate_limit_burst),
            ),
            metrics=app.state.metrics,
        )
        watch_catalogue(app.state, pool, checked, stack, app.state.metrics)  # SIGHUP reloads it

        # readiness asks the broker itself (metadata, answer kept 1.5 s), not a flag set at start
        broker = CachedProbe(producer.client.fetch_all_metadata, name="kafka")
        stack.push_async_callback(broker.aclose)

        async def kafka_ok() -> bool:
            return plans.positioned and await broker()

        async def redis_ok() -> bool:
            return bool(await redis.ping())

        async def db_ok() -> bool:
            return await _pool_answers(pool)

        # docs/faults.md: required = the replica can serve nothing useful without it; a
        # capability's loss refuses only its requests (each with its code) and keeps the replica
        # in the Service. The datasets database serves every path; the broker every dataspace
        # request (no disclosure, no answer); Redis only lookup-filter misses and rate-limited reads
        # (GS-14), flows only pulls
        checks: dict[str, ReadinessCheck] = {"datasets_db": db_ok}
        capabilities: dict[str, ReadinessCheck] = {"redis": redis_ok}
        dataspace = settings.edr_enabled or settings.dps_enabled
        (checks if dataspace else capabilities)["kafka"] = kafka_ok
        if flows_pool is not None:
            fp = flows_pool

            async def flows_ok() -> bool:
                return await _pool_answers(fp)

            capabilities["flows_db"] = flows_ok
        app.state.gateway = gw
        app.state.checks = checks
        app.state.capabilities = capabilities
        log.info(
            "query_gateway_started",
            datasets=len(catalogue.datasets),
            catalogue_digest=checked.digest,
            reply_partition=plans.reply_partition,
        )
        yield
        app.state.checks = {}
        app.state.capabilities = {}


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


async def _started_producer(settings: Settings, stack: contextlib.AsyncExitStack) -> AIOKafkaProducer:
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka_bootstrap_servers,
        acks="all",
        enable_idempotence=settings.kafka_enable_idempotence,
        linger_ms=0,
    )
    await producer.start()
    stack.push_async_callback(_bounded_stop, producer)
    return producer


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
    settings: Settings,
    redis: aioredis.Redis,
    lease_s: float,
    metrics: Metrics,
    stack: contextlib.AsyncExitStack[bool | None],
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
        stack.push_async_callback(shared.close)
    return ConsumerSlots(settings.query_max_concurrent_per_consumer, shared)


def _refuse_early(settings: Settings) -> None:
    """The database-free checks of the catalogue: a typo is named before any connection opens."""
    try:
        parse_catalogue(settings)
    except CatalogueRefused as exc:
        raise StartupRefused(str(exc)) from None


def _records_state(
    app: FastAPI, catalogue: Catalogue, pool: asyncpg.Pool, stack: contextlib.AsyncExitStack[bool | None]
) -> None:
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


async def _bounded_stop(producer: AIOKafkaProducer) -> None:
    # a broker that is gone must not hold the shutdown: unsent events are the safe direction
    with contextlib.suppress(Exception, asyncio.CancelledError):
        await asyncio.wait_for(producer.stop(), 10)


class GatewayApp(FastAPI):
    """The FastAPI app behind the query routes' plain door: every request meets `door` first
    (routes.py), which answers the well-formed query requests and hands the rest to FastAPI."""

    door: ASGIApp

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.door(scope, receive, send)

    async def framework(self, scope: Scope, receive: Receive, send: Send) -> None:
        await super().__call__(scope, receive, send)


def create_app(settings: Settings) -> FastAPI:
    app = GatewayApp(
        title="query-gateway",
        summary="SQL over governed datasets: the normal path, the legacy EDR path, DPS pulls",
        version=distribution_version("dataplane-query-gateway"),
        lifespan=_lifespan,
        # served by FastAPI behind the plain door (which passes every other route on): the
        # document describes the query routes as both doors answer them (query_gateway.openapi)
        openapi_url="/openapi.json",
        docs_url=None,  # served from the package (dataplane_service_kit.docs_ui), not a CDN
        redoc_url=None,
        telemetry=FASTAPI_TELEMETRY,
    )
    app.openapi = openapi_document(  # type: ignore[method-assign]
        app, exact=(QueryBody,), security_schemes=api.SECURITY_SCHEMES
    )
    serve_docs(app)
    app.state.settings = settings
    # this app's metrics (served by its /metrics); nothing of ours is in the global registry
    metrics = app.state.metrics = Metrics()
    app.state.checks = {}
    app.state.capabilities = {}
    app.state.cursor_codec = None
    app.state.change_watchers = None
    # a body that is not JSON at all (invalid UTF-8 among others) is 400 invalid_body: refused
    # before anything reads it, like a NUL or a lone surrogate in the statement
    install_error_handlers(
        app, "invalid_request", "invalid_body", expected_fields=tuple(QueryBody.model_fields)
    )
    install_profile_errors(app)  # the records routes' 400 invalid_request (docs/records.md)
    # the query routes' plain-ASGI front door (routes.py), in front of everything FastAPI adds:
    # a well-formed request is answered there; what it passes on meets the body limit below
    app.door = QueryRoutes(
        app.framework,
        settings.dps_enabled,
        max_bytes=settings.query_max_body_bytes,
        spans=ServerSpans(),
        state=app.state,
        metrics=metrics,
    )
    app.add_middleware(RequestDurations, histogram=metrics.request_duration)
    # before any route reads the body: FastAPI decodes it before the handler runs
    app.add_middleware(
        BodyLimit,
        max_bytes=settings.query_max_body_bytes,
        refused=body_refusals(settings.dps_enabled, metrics),
    )

    def checks() -> Mapping[str, ReadinessCheck]:
        named: Mapping[str, ReadinessCheck] = app.state.checks
        if not named:

            async def starting() -> bool:
                return False

            return {"startup": starting}
        return named

    def capabilities() -> Mapping[str, ReadinessCheck]:
        named: Mapping[str, ReadinessCheck] = app.state.capabilities
        return named

    app.include_router(health_router(checks, registry=metrics.registry, capabilities=capabilities))
    app.include_router(query_router())
    if settings.dps_enabled:  # DPS-01: the pull route exists only on a DPS data plane
        app.include_router(dps_router())
        app.include_router(records_router())
    return app
