"""The signaling application factory and its lifespan (clients created and disposed there)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager

import asyncpg
from aiokafka import AIOKafkaProducer
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from sqlalchemy import exc as sa_exc
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from starlette.types import ASGIApp, Receive, Scope, Send

from dataplane_contracts.dps import REFRESH_PATH
from dataplane_service_kit import front_door
from dataplane_service_kit.docs_ui import serve_docs
from dataplane_service_kit.errors import ServiceError, install_error_handlers
from dataplane_service_kit.health import ReadinessCheck, health_router
from dataplane_service_kit.kafka import started_producer
from dataplane_service_kit.logs import get_logger
from dataplane_service_kit.oauth import service_token
from dataplane_service_kit.openapi import distribution_version, openapi_document
from dataplane_service_kit.outbound_tls import outbound_http
from dataplane_service_kit.shutdown import stop_on_exit
from dataplane_service_kit.telemetry import FASTAPI_TELEMETRY
from signaling import audit
from signaling.callback_relay import CallbackRelay
from signaling.callbacks import ControlPlaneClient
from signaling.catalogue import CatalogueSource
from signaling.did_web import DidWebResolver
from signaling.flows import FlowService
from signaling.metrics import FlowGauge, Metrics
from signaling.migrate import check_at_head
from signaling.oidc import JwtVerifier
from signaling.openapi import SECURITY_SCHEMES
from signaling.outbox import OutboxRelay
from signaling.renewal import TokenRenewal
from signaling.routes import dps_router, token_router
from signaling.settings import Settings
from signaling.state import AppState, Dps
from signaling.tokens import PullTokenSigner

log = get_logger(__name__)


def _build_dps(settings: Settings, state: AppState) -> Dps:
    key = settings.signing_key
    issuer, jwks_uri, token_url = settings.oidc_issuer(), settings.oidc_jwks_uri(), settings.oidc_token_url()
    if key is None or not issuer or not jwks_uri or not token_url or not settings.celine_oidc_audience:
        # Settings validation already refuses this; never serve signalling without them
        raise RuntimeError("DPS_ENABLED needs DPS_TOKEN_SIGNING_KEY and the CELINE_OIDC_* settings")
    # used for callbacks only, each fetch bounded like a callback; no client id: no bearer
    tokens = service_token(state.http, settings, timeout_s=settings.callback_timeout_seconds)
    relay = state.relay
    signer = PullTokenSigner(key, settings.dps_token_key_id, settings.dps_token_ttl_seconds)
    on_commit = relay.wake if relay is not None else (lambda: None)
    flows = FlowService(
        state.engine,
        signer,
        settings.dps_public_url,
        list(settings.dps_transfer_types),
        on_commit=on_commit,
        refresh_endpoint=settings.refresh_endpoint(),
        catalogue=CatalogueSource(settings.catalogue_path) if settings.catalogue_path else None,
        asynchronous=settings.dps_async_signals,
        metrics=state.metrics,
    )
    control_planes = ControlPlaneClient(state.http, state.engine, tokens, settings.callback_timeout_seconds)
    callbacks = CallbackRelay(
        state.engine,
        flows,
        control_planes,
        first_retry_s=settings.dps_callback_retry_first_seconds,
        max_retry_s=settings.dps_callback_retry_max_seconds,
        poll_interval_s=settings.outbox_poll_interval_ms / 1000,
        # a token fetch and the POST, each bounded by the callback timeout, and a margin
        attempt_s=2 * settings.callback_timeout_seconds + 1,
        metrics=state.metrics,
        on_commit=on_commit,
    )
    flows.on_callback_owed = callbacks.wake
    return Dps(
        flows=flows,
        verifier=JwtVerifier(
            state.http,
            issuer,
            settings.celine_oidc_audience,
            jwks_uri=jwks_uri,
            min_refetch_seconds=settings.celine_oidc_jwks_min_refetch_seconds,
        ),
        control_planes=control_planes,
        admitted=frozenset(settings.dps_control_plane_clients),
        renewal=TokenRenewal(
            state.engine,
            signer,
            key.public_key(),
            DidWebResolver(
                state.http,
                allow_http=settings.dps_did_web_allow_http,
                timeout_s=settings.callback_timeout_seconds,
            ),
            metrics=state.metrics,
        ),
        callbacks=callbacks,
    )


def _lifespan(settings: Settings, metrics: Metrics):  # type: ignore[no-untyped-def]
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            engine = await _flows_database(settings, stack)
            http = outbound_http(settings, timeout=settings.callback_timeout_seconds)
            stop_on_exit(stack, "http_client", http.aclose)
            producer = await started_producer(settings, stack)
            relay = _outbox_relay(settings, engine, producer, metrics, stack)
            gauge = FlowGauge(engine, metrics, settings.flow_metrics_interval_seconds)
            state = AppState(settings, engine, http, producer, relay, metrics, gauge, None)
            if settings.dps_enabled:
                state.dps = _build_dps(settings, state)
                if settings.dps_callback_relay_enabled:
                    state.dps.callbacks.start()  # delivers what any replica's 202 promised
                    stop_on_exit(stack, "callback_relay", state.dps.callbacks.stop)
            app.state.signaling = state
            log.info("signaling_started", dps_enabled=settings.dps_enabled, relay=relay is not None)
            yield

    return lifespan


async def _flows_database(settings: Settings, stack: AsyncExitStack[bool | None]) -> AsyncEngine:
    """The flows database's engine, refused (`startup_refused`) unless its schema is at head."""
    engine = create_async_engine(
        settings.database_url,
        pool_size=settings.db_pool_size,
        pool_pre_ping=True,
        pool_timeout=settings.db_acquire_timeout_seconds,
        # asyncpg's own: opening a connection, and every statement (the pre-ping included)
        connect_args={
            "timeout": settings.db_acquire_timeout_seconds,
            "command_timeout": settings.db_command_timeout_seconds,
        },
    )
    stop_on_exit(stack, "flows_database", engine.dispose)
    try:
        await check_at_head(engine)
    except Exception as exc:
        log.error("startup_refused", reason=str(exc))
        raise
    return engine


def _outbox_relay(
    settings: Settings,
    engine: AsyncEngine,
    producer: AIOKafkaProducer,
    metrics: Metrics,
    stack: AsyncExitStack[bool | None],
) -> OutboxRelay | None:
    """The flow events' outbox relay (OUTBOX_RELAY_ENABLED), started and stopped here."""
    if not settings.outbox_relay_enabled:
        return None
    relay = OutboxRelay(
        engine, producer, settings.outbox_poll_interval_ms / 1000, settings.outbox_batch_size, metrics=metrics
    )
    relay.start()
    stop_on_exit(stack, "outbox_relay", relay.stop)
    return relay


def _checks(app: FastAPI) -> Mapping[str, ReadinessCheck]:
    state: AppState | None = getattr(app.state, "signaling", None)
    if state is None:
        return {}

    async def database() -> bool:
        async with state.engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
        return True

    async def kafka() -> bool:
        await state.producer.client.fetch_all_metadata()
        return True

    return {"database": database, "kafka": kafka}


def _signal_of(request: Request) -> str:
    """The signal a refusal belongs to: the last literal segment of the route template."""
    literal = [seg for seg in audit.route_template(request).split("/") if seg and not seg.startswith("{")]
    return literal[-1] if literal else "unknown"


# what a lost, stopped or killed database raises through SQLAlchemy and asyncpg (a pool timeout,
# a driver error, a connection released after the server killed it, our own timeouts): 503
# database_unavailable, never a bare 500. An SQL error of ours is a DBAPIError too: also 503, as
# the caller can do nothing about it either, and the log names the class
DATABASE_FAILURES: tuple[type[Exception], ...] = (
    sa_exc.DBAPIError,
    sa_exc.TimeoutError,
    asyncpg.InternalClientError,
    asyncpg.InterfaceError,
    OSError,
    TimeoutError,
)


# character_not_in_repertoire (a NUL in text), untranslatable_character: what PostgreSQL answers
# for a string of the request it cannot store; a lone surrogate never gets this far (not JSON)
UNSTORABLE_TEXT = frozenset({"22021", "22P05"})


def _sqlstate(exc: Exception) -> str | None:
    """The SQLSTATE of a driver error under SQLAlchemy's wrapper, when there is one."""
    orig = getattr(exc, "orig", None)
    for candidate in (orig, getattr(orig, "__cause__", None), exc):
        state = getattr(candidate, "sqlstate", None) or getattr(candidate, "pgcode", None)
        if isinstance(state, str):
            return state
    return None


def _install_audited_errors(app: FastAPI, metrics: Metrics) -> None:
    """Render errors once (service kit) and, for signalling routes, write the GS-02 record."""
    install_error_handlers(app, invalid_request_code="invalid_message")
    render_service = app.exception_handlers[ServiceError]
    render_invalid = app.exception_handlers[RequestValidationError]

    def record(request: Request, code: str, status: int) -> None:
        if request.url.path.startswith("/dps"):
            caller = getattr(request.state, "caller", None)
            action = "dps.token_refresh" if request.url.path == REFRESH_PATH else "dps.signal"
            audit.signal_refused(request, code, status, caller, action)
            metrics.signals.labels(signal=_signal_of(request), outcome=code).inc()

    async def on_service_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ServiceError)
        record(request, exc.code, exc.status_code)
        response = render_service(request, exc)
        assert not isinstance(response, Response)
        rendered: Response = await response
        return rendered

    async def on_invalid(request: Request, exc: Exception) -> Response:
        record(request, "invalid_message", 422)
        response = render_invalid(request, exc)
        assert not isinstance(response, Response)
        rendered: Response = await response
        return rendered

    async def on_database_failure(request: Request, exc: Exception) -> Response:
        if _sqlstate(exc) in UNSTORABLE_TEXT:
            # the caller's text (a NUL) that PostgreSQL cannot take: their mistake, nothing stored
            return await on_service_error(
                request,
                ServiceError("invalid_message", "the request holds text PostgreSQL cannot take (a NUL)"),
            )
        # the driver's text may quote SQL or values: the log keeps the class, the answer neither
        log.warning("database_unavailable", error=type(exc).__name__)
        return await on_service_error(
            request, ServiceError("database_unavailable", "the flows database cannot be reached now")
        )

    app.add_exception_handler(ServiceError, on_service_error)
    app.add_exception_handler(RequestValidationError, on_invalid)
    for failure in DATABASE_FAILURES:
        app.add_exception_handler(failure, on_database_failure)


class RecountFlowsOnScrape:
    """The kit's /metrics renders the registry; the flows gauge is recounted just before.

    Plain ASGI rather than an HTTP middleware: every other request passes straight through."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/metrics":
            state: AppState | None = getattr(scope["app"].state, "signaling", None)
            if state is not None:
                await state.flow_gauge.refresh()
        await self.app(scope, receive, send)


def create_app(settings: Settings) -> FastAPI:
    # this app's own registry: made here, not in the lifespan, as the middleware below needs it
    metrics = Metrics()
    app = FastAPI(
        title="dataplane signaling",
        summary="Data Plane Signaling: data flows, pull tokens, control-plane registrations",
        version=distribution_version("dataplane-signaling"),
        lifespan=_lifespan(settings, metrics),
        openapi_url="/openapi.json",
        docs_url=None,  # served from the package (dataplane_service_kit.docs_ui), not a CDN
        redoc_url=None,
        telemetry=FASTAPI_TELEMETRY,
    )
    app.openapi = openapi_document(  # type: ignore[method-assign]
        app, security_schemes=SECURITY_SCHEMES if settings.dps_enabled else None
    )
    serve_docs(app)
    _install_audited_errors(app, metrics)
    app.add_middleware(RecountFlowsOnScrape)
    # outermost: the front door every request passes (request id, body bound, span, metrics)
    front_door.install(
        app,
        max_body_bytes=settings.signaling_max_body_bytes,
        durations=metrics.request_duration,
        requests=metrics.requests,
    )
    # /metrics renders this app's registry (readiness_dependency_up is registered on it too)
    app.include_router(health_router(lambda: _checks(app), registry=metrics.registry))
    if settings.dps_enabled:  # DPS-01: nothing under /dps exists otherwise
        app.include_router(dps_router)
        app.include_router(token_router)
    return app


__all__ = ["create_app"]
