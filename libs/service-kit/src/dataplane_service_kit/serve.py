"""Run an ASGI app with uvicorn, logging through our JSON configuration."""

from __future__ import annotations

import uvicorn
from fastapi import FastAPI


def serve(app: FastAPI, host: str, port: int) -> None:
    uvicorn.run(app, host=host, port=port, log_config=None, access_log=False, lifespan="on")
