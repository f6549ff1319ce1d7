"""The query-gateway FastAPI app. Its clients are opened and closed by the lifespan
(query_gateway.lifespan), which refuses a catalogue that contradicts the handler table (GS-08) or
names a column the database lacks (GS-09): `StartupRefused`."""

from __future__ import annotations

from collections.abc import Mapping

from fastapi import FastAPI

from dataplane_service_kit import front_door
from dataplane_service_kit.docs_ui import serve_docs
from dataplane_service_kit.errors import install_error_handlers
from dataplane_service_kit.health import ReadinessCheck, health_router
from dataplane_service_kit.openapi import distribution_version, openapi_document
from dataplane_service_kit.telemetry import FASTAPI_TELEMETRY
from query_gateway import openapi as api
from query_gateway.lifespan import StartupRefused, lifespan
from query_gateway.metrics import Metrics
from query_gateway.pipeline import QueryBody
from query_gateway.records.routes import install_profile_errors, records_router
from query_gateway.routes import QueryRoutes, body_refusals, dps_router, query_router
from query_gateway.settings import Settings

__all__ = ["StartupRefused", "create_app"]


def create_app(settings: Settings) -> FastAPI:
    app = FastAPI(
        title="query-gateway",
        summary="SQL over governed datasets: the normal path, the legacy EDR path, DPS pulls",
        version=distribution_version("dataplane-query-gateway"),
        lifespan=lifespan,
        # the document describes the query routes as the fast path and FastAPI both answer them
        # (query_gateway.openapi)
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
    # innermost: the query routes' fast path (routes.py); every middleware added after it sees
    # every request, the fast path's included
    app.add_middleware(QueryRoutes, dps_enabled=settings.dps_enabled, state=app.state)
    # outermost: the front door every request passes (request id, body bound, span, metrics)
    front_door.install(
        app,
        max_body_bytes=settings.query_max_body_bytes,
        durations=metrics.request_duration,
        requests=metrics.requests,
        refused=body_refusals(settings.dps_enabled),
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
