"""The resolver's process: the Kafka consumer and a small HTTP app for /healthz /readyz /metrics.

Clients (Redis, httpx, the datasets pool, Kafka) are created in the lifespan and closed there.
Plugins are loaded in create_app, so a plugin module that cannot be used stops the start."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

import asyncpg
import httpx
import redis.asyncio as aioredis
from fastapi import FastAPI

from dataplane_service_kit import front_door
from dataplane_service_kit.health import ReadinessCheck, health_router
from dataplane_service_kit.logs import get_logger
from dataplane_service_kit.oauth import service_token
from dataplane_service_kit.outbound_tls import outbound_http, settings_ssl_context
from dataplane_service_kit.readiness import BrokerMetadata, CachedProbe
from dataplane_service_kit.redis_clients import opened_redis
from dataplane_service_kit.shutdown import stop_on_exit
from dataplane_service_kit.telemetry import FASTAPI_TELEMETRY
from filter_resolver.consumer import PlanRequestConsumer
from filter_resolver.handlers.http_in_list import HttpInListHandler
from filter_resolver.handlers.plugins import (
    PluginHandler,
    PluginLoadError,
    load_entry_point_plugins,
    load_module_plugins,
)
from filter_resolver.handlers.rec_registry import RecRegistryHandler
from filter_resolver.handlers.table_pointer import TablePointerHandler
from filter_resolver.metrics import Metrics
from filter_resolver.registry import HandlerRegistry
from filter_resolver.resolver import Resolver
from filter_resolver.settings import Settings
from filter_resolver.tokens import ClientCredentials

log = get_logger(__name__)

# below the registry's idle timeout (uvicorn's default is 5 s): the resolver drops an idle
# connection before the server closes it, so a lookup is not sent on a connection being closed
REGISTRY_KEEPALIVE_EXPIRY_S = 4.0


@dataclass
class Runtime:
    """The clients and the resolver; `checks()` reads it per /readyz request. `stops` closes
    what `open_runtime` opened, each part bounded; the consumer (started once the runtime is
    built) is stopped before them."""

    redis: aioredis.Redis
    http: httpx.AsyncClient
    pool: DatasetsPool
    registry: HandlerRegistry
    resolver: Resolver
    broker: BrokerMetadata
    stops: contextlib.AsyncExitStack[bool | None]
    consumer: PlanRequestConsumer | None = None

    def __post_init__(self) -> None:
        # the broker itself is asked (metadata, answer kept 1.5 s): holding partitions says
        # nothing about a broker that stopped answering since
        self._broker_up = CachedProbe(self.broker.fetch, name="kafka")
        stop_on_exit(self.stops, "kafka_probe", self._broker_up.aclose)

    def start_consumer(self, settings: Settings, metrics: Metrics) -> None:
        self.consumer = PlanRequestConsumer(settings, self.resolver, metrics)
        self.consumer.start()

    def checks(self) -> Mapping[str, ReadinessCheck]:
        async def kafka() -> bool:
            return self.consumer is not None and self.consumer.ready() and await self._broker_up()

        async def redis() -> bool:
            return bool(await self.redis.ping())

        return {"kafka": kafka, "redis": redis}

    async def aclose(self) -> None:
        if self.consumer is not None:
            await self.consumer.stop()  # its commit and its two clients each bounded (consumer.py)
        await self.stops.aclose()


class DatasetsPool:
    """The read-only datasets pool, opened on first use so a resolver without table_pointer
    datasets never needs the database."""

    def __init__(self, url: str | None) -> None:
        self._url = url
        self._pool: asyncpg.Pool | None = None
        self._lock = asyncio.Lock()

    async def get(self) -> asyncpg.Pool | None:
        if self._url is None:
            return None
        async with self._lock:
            if self._pool is None:
                self._pool = await asyncpg.create_pool(
                    self._url,
                    min_size=0,
                    max_size=5,
                    # defence in depth beside the read-only role: this service never writes there
                    server_settings={"default_transaction_read_only": "on"},
                )
            return self._pool

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None


def load_plugins(settings: Settings) -> list[PluginHandler]:
    """ROW_FILTERS_MODULES (a failure is fatal), then the entry points (RF-09); every name of
    ROW_FILTERS_PLUGIN_HANDLERS must be among them (GS-08: the gateway accepts a catalogue
    handler on the strength of that list)."""
    plugins = [*load_module_plugins(settings.row_filters_modules), *load_entry_point_plugins()]
    loaded = {p.name for p in plugins}
    missing = [name for name in settings.row_filters_plugin_handlers if name not in loaded]
    if missing:
        raise PluginLoadError(
            f"ROW_FILTERS_PLUGIN_HANDLERS names {', '.join(repr(m) for m in missing)}, which no loaded "
            "plugin provides (ROW_FILTERS_MODULES, entry points)"
        )
    return plugins


def open_runtime(settings: Settings, metrics: Metrics, plugins: list[PluginHandler]) -> Runtime:
    """Build the clients, the handler registry and the resolver (no Kafka consumer yet)."""
    stops: contextlib.AsyncExitStack[bool | None] = contextlib.AsyncExitStack()
    redis = opened_redis(settings, stops)
    # one trust store for the registry, the issuer, list endpoints and the registry SDK's clients
    tls = settings_ssl_context(settings)
    http = _outbound_http(tls, stops)
    db_url = settings.datasets_database_url
    pool = DatasetsPool(db_url.get_secret_value() if db_url else None)
    stop_on_exit(stops, "datasets_pool", pool.close)
    broker = BrokerMetadata(settings.kafka_bootstrap_servers)
    stop_on_exit(stops, "kafka_metadata", broker.close)
    registry = _handlers(settings, http, tls, pool, plugins)
    resolver = Resolver(
        redis=redis,
        registry=registry,
        secret=settings.row_filters_cache_key_secret.get_secret_value().encode(),
        default_ttl=settings.row_filters_cache_ttl,
        retry_attempts=settings.resolver_retry_attempts,
        retry_base_ms=settings.resolver_retry_base_ms,
        metrics=metrics,
    )
    return Runtime(
        redis=redis, http=http, pool=pool, registry=registry, resolver=resolver, broker=broker, stops=stops
    )


def _outbound_http(tls: ssl.SSLContext, stops: contextlib.AsyncExitStack[bool | None]) -> httpx.AsyncClient:
    http = outbound_http(
        tls, follow_redirects=False, limits=httpx.Limits(keepalive_expiry=REGISTRY_KEEPALIVE_EXPIRY_S)
    )
    stop_on_exit(stops, "http_client", http.aclose)
    return http


def _handlers(
    settings: Settings,
    http: httpx.AsyncClient,
    tls: ssl.SSLContext,
    pool: DatasetsPool,
    plugins: list[PluginHandler],
) -> HandlerRegistry:
    """The built-in handlers and the plugins; the REC registry's lookups go with this service's
    own token (RF-05), each fetch bounded like a lookup."""
    timeout = settings.rec_registry_timeout_seconds
    credentials = ClientCredentials(
        service_token(http, settings, timeout_s=timeout, scope=settings.rec_registry_lookup_scope)
    )
    registry = HandlerRegistry()
    registry.add(RecRegistryHandler(http, credentials, settings.rec_registry_url, timeout, tls))
    registry.add(HttpInListHandler(http))
    registry.add(TablePointerHandler(pool.get))
    registry.extend(plugins)
    return registry


def create_app(settings: Settings, metrics: Metrics | None = None) -> FastAPI:
    metrics = metrics or Metrics()
    plugins = load_plugins(settings)  # before serving: a bad plugin module stops the start
    holder: dict[str, Runtime] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            runtime = open_runtime(settings, metrics, plugins)
            stack.push_async_callback(runtime.aclose)  # each of its parts bounded
            runtime.start_consumer(settings, metrics)
            holder["runtime"] = runtime
            stack.callback(holder.pop, "runtime", None)  # /readyz answers "starting" again
            log.info(
                "filter_resolver_started",
                handlers=runtime.registry.names(),
                topic=settings.plan_requests_topic,
            )
            yield

    def checks() -> Mapping[str, ReadinessCheck]:
        runtime = holder.get("runtime")
        if runtime is None:
            return {"kafka": _never, "redis": _never}
        return runtime.checks()

    # health and metrics only: no OpenAPI document, no /docs (the Kafka side: docs/asyncapi.yaml)
    app = FastAPI(
        title="filter-resolver",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        telemetry=FASTAPI_TELEMETRY,
    )
    app.include_router(health_router(checks, registry=metrics.registry))
    front_door.install(app)  # request ids and server spans, as on every service
    return app


async def _never() -> bool:
    return False
