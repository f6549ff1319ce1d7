"""The OpenAPI viewer served from the package (Swagger UI, vendored by `swagger-ui-bundle`), so a
cluster without internet access still shows it: FastAPI's default page loads it from a CDN."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from swagger_ui_bundle import swagger_ui_path

DOCS = "/docs"
ASSETS = "/openapi-viewer"  # the viewer's script, style and icon


def serve_docs(app: FastAPI, openapi_url: str = "/openapi.json") -> None:
    """`GET /docs`, the viewer, its script and style from `ASSETS` (the app's
    `docs_url` must be None, or FastAPI adds its CDN page first)."""
    app.mount(ASSETS, StaticFiles(directory=str(swagger_ui_path)), name="docs-assets")

    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{app.title} — API",
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS}/favicon-32x32.png",
        )

    app.add_api_route(DOCS, docs, methods=["GET"], include_in_schema=False)
