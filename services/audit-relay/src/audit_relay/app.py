"""The relay's process: the consumer runs in the lifespan; HTTP serves only /healthz, /readyz and
/metrics."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator

from aiokafka import AIOKafkaConsumer
from fastapi import FastAPI

from audit_relay.delivery import ConnectorPools, DsSender
from audit_relay.health import Health
from audit_relay.metrics import Metrics
from audit_relay.relay import Relay
from audit_relay.settings import Settings
from dataplane_service_kit import front_door
from dataplane_service_kit.health import health_router
from dataplane_service_kit.kafka import KAFKA_STOP_BOUND_S, kafka_producer
from dataplane_service_kit.logs import get_logger
from dataplane_service_kit.oauth import service_token
from dataplane_service_kit.outbound_tls import outbound_http, settings_ssl_context
from dataplane_service_kit.shutdown import stop_on_exit
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


def create_app(settings: Settings) -> FastAPI:
    health = Health(settings.audit_relay_unready_grace_s)
    metrics = Metrics()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            # the issuer's client; ds gets a pool per connector (ConnectorPools)
            tls = settings_ssl_context(settings)
            client = outbound_http(tls, timeout=settings.audit_relay_http_timeout_s, follow_redirects=False)
            stop_on_exit(stack, "http_client", client.aclose)
            pools = ConnectorPools(
                max_in_flight=settings.audit_relay_max_in_flight_per_connector,
                timeout_s=settings.audit_relay_http_timeout_s,
                tls=tls,
            )
            stop_on_exit(stack, "connector_pools", pools.aclose)
            # started by the relay, which retries while no broker answers
            producer = kafka_producer(settings)
            stop_on_exit(stack, "kafka_producer", producer.stop, KAFKA_STOP_BOUND_S)
            consumer = _consumer(settings)
            stop_on_exit(stack, "kafka_consumer", consumer.stop)
            token = service_token(client, settings, timeout_s=settings.audit_relay_http_timeout_s)
            relay = Relay(
                settings=settings,
                consumer=consumer,
                producer=producer,
                sender=DsSender(pools, token, health),
                health=health,
                metrics=metrics,
            )
            task = asyncio.create_task(relay.run(), name="audit-relay")
            task.add_done_callback(_report_crash)
            stop_on_exit(stack, "relay", functools.partial(_cancelled, task))
            stop_on_exit(stack, "workers", relay.stop)
            stack.callback(setattr, health, "consuming", False)
            yield

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


async def _cancelled(task: asyncio.Task[None]) -> None:
    """Cancel the poll loop and wait until it has ended. `asyncio.wait` rather than awaiting the
    task: the loop's own CancelledError is not taken for one aimed at the shutdown (which must
    still pass, as must the stop's bound); a crash is logged once, by `_report_crash`."""
    task.cancel()
    await asyncio.wait([task])


def _report_crash(task: asyncio.Task[None]) -> None:
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        # the readiness check reports it too: consuming stops being true only at shutdown, so a
        # dead loop shows as a broker probe that no longer succeeds
        log.error("relay_crashed", error=type(exc).__name__, exc_info=exc)
