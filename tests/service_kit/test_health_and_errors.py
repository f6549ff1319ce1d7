"""The health, readiness and error rendering every service shares."""

from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI
from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings

from dataplane_service_kit.errors import ServiceError, install_error_handlers
from dataplane_service_kit.health import health_router
from dataplane_service_kit.settings import ConfigurationError, load_settings


async def _ok() -> bool:
    return True


async def _down() -> bool:
    raise ConnectionError("redis://user:secret@host:6379 refused")


def _app(checks: dict) -> FastAPI:
    app = FastAPI()
    app.include_router(health_router(lambda: checks))
    install_error_handlers(app, "invalid_request")

    @app.get("/boom")
    async def boom() -> None:
        raise ServiceError("pull_token", "the pull token is not live")

    return app


async def _get(app: FastAPI, path: str) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        return await c.get(path)


async def test_readyz_names_failing_dependencies_without_their_urls() -> None:
    resp = await _get(_app({"database": _ok, "redis": _down}), "/readyz")
    assert resp.status_code == 503
    assert resp.json()["failing"] == ["redis"]
    assert "secret" not in resp.text


async def test_healthz_and_readyz_ok() -> None:
    app = _app({"database": _ok})
    assert (await _get(app, "/healthz")).json() == {"status": "ok"}
    assert (await _get(app, "/readyz")).status_code == 200
    metrics = await _get(app, "/metrics")
    assert metrics.status_code == 200 and "python_info" in metrics.text


async def test_service_error_rendered_with_code_and_status() -> None:
    resp = await _get(_app({}), "/boom")
    assert resp.status_code == 401
    assert resp.json() == {
        "type": "urn:dataplane:error:pull_token",
        "title": "Pull token",
        "status": 401,
        "error": "pull_token",
        "detail": "the pull token is not live",
    }
    assert resp.headers["content-type"] == "application/problem+json"
    assert resp.headers["www-authenticate"] == 'Bearer error="invalid_token"'


class _Demo(BaseSettings):
    kafka_bootstrap_servers: str = Field(min_length=1)
    row_filters_cache_key_secret: SecretStr


def test_invalid_configuration_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.delenv("ROW_FILTERS_CACHE_KEY_SECRET", raising=False)
    with pytest.raises(ConfigurationError):
        load_settings(_Demo)
    err = capsys.readouterr().err
    assert "KAFKA_BOOTSTRAP_SERVERS" in err and "ROW_FILTERS_CACHE_KEY_SECRET" in err
