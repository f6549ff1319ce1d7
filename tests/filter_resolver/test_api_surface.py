"""Issue 14: the resolver serves its health and metrics routes and nothing else — no OpenAPI
document, no /docs (what it consumes and publishes: docs/asyncapi.yaml)."""

from __future__ import annotations

import httpx

from dataplane_testing.resolver import make_settings
from filter_resolver.app import create_app


async def test_only_health_and_metrics_no_openapi_document() -> None:
    app = create_app(make_settings())  # the routes exist from construction; no lifespan needed
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://resolver") as client:
        assert (await client.get("/healthz")).status_code == 200
        assert (await client.get("/metrics")).status_code == 200
        for path in ("/openapi.json", "/docs", "/redoc"):
            assert (await client.get(path)).status_code == 404, path
