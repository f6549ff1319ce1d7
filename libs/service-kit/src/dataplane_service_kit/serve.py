"""Run an ASGI app with uvicorn, logging through our JSON configuration."""

from __future__ import annotations

import uvicorn
from fastapi import FastAPI

from dataplane_service_kit.telemetry import instrument_app

# How long the server keeps an idle keep-alive connection open (HTTP_KEEP_ALIVE_TIMEOUT_SECONDS).
# Above the keep-alive expiry of every client that calls us (httpx 5 s, aiohttp 15 s, an ingress
# or load balancer 60 s): the side that closes an idle connection must be the client, else a
# request sent as the server closes meets a reset. uvicorn's own default (5 s) equals httpx's.
DEFAULT_KEEP_ALIVE_S = 75.0


def serve(app: FastAPI, host: str, port: int, *, keep_alive_s: float = DEFAULT_KEEP_ALIVE_S) -> None:
    instrument_app(app)
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_config=None,
        access_log=False,
        lifespan="on",
        # uvicorn takes whole seconds; never round a fractional setting down to "close at once"
        timeout_keep_alive=max(1, round(keep_alive_s)),
    )
