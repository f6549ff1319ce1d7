"""The relay's process: the consumer runs in the lifespan; HTTP serves only /healthz, /readyz and
/metrics."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from fastapi import FastAPI

from audit_relay.delivery import ConnectorPools, DsSender
from audit_relay.health import Health
from audit_relay.metrics import Metrics
from audit_relay.relay import Relay
from audit_relay.settings import Settings
from dataplane_service_kit import front_door
from dataplane_service_kit.health import health_router
from dataplane_service_kit.logs import get_logger
from dataplane_service_kit.oauth import ClientCredentialsToken
from dataplane_service_kit.outbound_tls import outbound_http, settings_ssl_context
from dataplane_service_kit.telemetry import FASTAPI_TELEMETRY

log = get_logger(__name__)


def _consumer(settings: Settings) -> AIOKafkaConsumer:
    session_ms = settings.audit_relay_session_timeout_ms
    return AIOKafkaConsumer(
        bootstrap_servers=settings.kafka_bootstrap_servers,
        group_id=settings.audit_relay_group_id,
        enable_auto_commit=False,  # committed by the relay, only after ds or the DLQ has the record
        auto_offset_reset="earliest",  # a new group must not skip disclosures already published
        fetch_max_wait_ms=settings.bulk_fetch_max_wait_ms(),  # latency-tolerant: a long wait
        session_timeout_ms=session_ms,
        heartbeat_interval_ms=max(100, session_ms // 3),
    )


def _producer(settings: Settings) -> AIOKafkaProducer:
    return AIOKafkaProducer(
        bootstrap_servers=settings.kafka_bootstrap_servers,
        acks="all",
        enable_idempotence=settings.kafka_enable_idempotence,
        linger_ms=0,
    )


def create_app(settings: Settings) -> FastAPI:
    health = Health(settings.audit_relay_unready_grace_s)
    metrics = Metrics()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # the issuer's client; ds gets a pool per connector (ConnectorPools)
        tls = settings_ssl_context(settings)
        client = outbound_http(tls, timeout=settings.audit_relay_http_timeout_s, follow_redirects=False)
        pools = ConnectorPools(
            max_in_flight=settings.audit_relay_max_in_flight_per_connector,
            timeout_s=settings.audit_relay_http_timeout_s,
            tls=tls,
        )
        secret = settings.celine_oidc_client_secret
        token = ClientCredentialsToken(
            client,
            token_url=settings.oidc_token_url(),
            client_id=settings.celine_oidc_client_id,
            client_secret=secret.get_secret_value() if secret is not None else None,
            timeout_s=settings.audit_relay_http_timeout_s,
        )
        relay = Relay(
            settings=settings,
            consumer=_consumer(settings),
            producer=_producer(settings),
            sender=DsSender(pools, token, health),
            health=health,
            metrics=metrics,
        )
        task = asyncio.create_task(relay.run(), name="audit-relay")
        task.add_done_callback(_report_crash)
        try:
            yield
        finally:
            health.consuming = False
            await _closing("workers", relay.stop())
            task.cancel()
            await _closing("relay", _settled(task))
            await _closing("consumer", relay.consumer.stop())
            await _closing("producer", relay.producer.stop())
            await _closing("connector_pools", pools.aclose())
            await _closing("http_client", client.aclose())

    # health and metrics only: no OpenAPI document, no /docs (the Kafka side: docs/asyncapi.yaml)
    app = FastAPI(
        title="audit-relay",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        telemetry=FASTAPI_TELEMETRY,
    )
    app.include_router(health_router(health.checks, registry=metrics.registry))
    front_door.install(app)  # request ids and server spans, as on every service
    return app


async def _settled(task: asyncio.Task[None]) -> None:
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def _closing(what: str, closing: Awaitable[object]) -> None:
    """Shut one part down; a failure (the broker gone, say) must not keep the others open.
    Uncommitted work is safe: it is delivered again, with the same Idempotency-Key."""
    try:
        await closing
    except asyncio.CancelledError:
        # aiokafka's fetcher leaks the CancelledError of its own task when the broker is gone;
        # only a cancellation aimed at this task is passed on
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
        log.warning("shutdown_step_failed", part=what, error="CancelledError")
    except Exception as exc:
        log.warning("shutdown_step_failed", part=what, error=type(exc).__name__)


def _report_crash(task: asyncio.Task[None]) -> None:
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        # the readiness check reports it too: consuming stops being true only at shutdown, so a
        # dead loop shows as a broker probe that no longer succeeds
        log.error("relay_crashed", error=type(exc).__name__, exc_info=exc)
