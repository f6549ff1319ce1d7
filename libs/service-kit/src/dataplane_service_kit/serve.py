"""Run an ASGI app with uvicorn, logging through our JSON configuration."""

from __future__ import annotations

import uvicorn
from fastapi import FastAPI

from dataplane_service_kit.telemetry import instrument_app


def serve(app: FastAPI, host: str, port: int) -> None:
    instrument_app(app)
    uvicorn.run(app, host=host, port=port, log_config=None, access_log=False, lifespan="on")
