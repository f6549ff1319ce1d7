"""Run an ASGI app with uvicorn on the shared HTTP settings (HTTP_HOST, HTTP_PORT,
HTTP_KEEP_ALIVE_TIMEOUT_SECONDS), logging through our JSON configuration."""

from __future__ import annotations

import uvicorn
from starlette.types import ASGIApp

from dataplane_contracts.settings import HttpSettings


def serve(app: ASGIApp, settings: HttpSettings) -> None:
    """Serve `app` until stopped. The idle keep-alive (HTTP_KEEP_ALIVE_TIMEOUT_SECONDS, 75 s by
    default) is above the keep-alive expiry of every client that calls us (httpx 5 s, aiohttp 15 s,
    an ingress or load balancer 60 s): the side that closes an idle connection must be the client,
    else a request sent as the server closes meets a reset. uvicorn's own default (5 s) equals
    httpx's. The app's own front door (`dataplane_service_kit.front_door`) makes every request's
    server span: no instrumentation is added here."""
    keep_alive_s = settings.http_keep_alive_timeout_seconds
    uvicorn.run(
        app,
        host=settings.http_host,
        port=settings.http_port,
        log_config=None,
        access_log=False,
        lifespan="on",
        # uvicorn takes whole seconds; never round a fractional setting down to "close at once"
        timeout_keep_alive=max(1, round(keep_alive_s)),
    )
