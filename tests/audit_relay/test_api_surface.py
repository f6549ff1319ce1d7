"""Issue 14: the relay serves its health and metrics routes and nothing else — no OpenAPI
document, no /docs (what it consumes and publishes: docs/asyncapi.yaml)."""

from __future__ import annotations

import httpx

from audit_relay.app import create_app
from audit_relay.settings import Settings


async def test_only_health_and_metrics_no_openapi_document() -> None:
    settings = Settings(kafka_bootstrap_servers="127.0.0.1:1", connector_internal_url="http://127.0.0.1:1")
    app = create_app(settings)  # the routes exist from construction; no lifespan needed
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://relay") as client:
        assert (await client.get("/healthz")).status_code == 200
        assert (await client.get("/metrics")).status_code == 200
        for path in ("/openapi.json", "/docs", "/redoc"):
            assert (await client.get(path)).status_code == 404, path
