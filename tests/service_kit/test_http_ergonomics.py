"""What every answer of a service carries (docs/wire-contracts.md, "Errors"; docs/operations.md,
"Request ids"): RFC 9457 problem documents keeping `error` and `detail`, a challenge on every
401, `X-Request-ID` on every answer, refusals of a body that say what is wrong with it."""

from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict

from dataplane_service_kit import front_door
from dataplane_service_kit.errors import ServiceError, install_error_handlers
from dataplane_service_kit.telemetry import ServerSpans

JSON = {"content-type": "application/json"}


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")
    sql: str | None = None
    limit: int = 100


def _app() -> FastAPI:
    app = FastAPI()
    install_error_handlers(app, "invalid_request", "invalid_body", expected_fields=("sql", "limit"))
    front_door.install(app, ServerSpans({"OTEL_SDK_DISABLED": "true"}))

    @app.post("/q")
    async def q(body: _Body) -> dict[str, object]:
        return {"ok": True}

    @app.get("/anonymous")
    async def anonymous() -> None:
        raise ServiceError("auth_required", "authentication required")

    @app.get("/refused-token")
    async def refused_token() -> None:
        raise ServiceError("invalid_token", "bearer token is not valid")

    @app.get("/fault")
    async def fault() -> None:
        raise RuntimeError("a fault quoting did:web:secret.example and a token eyJhbGciOi")

    return app


def _client() -> httpx.AsyncClient:
    # the framework re-raises an unhandled exception after answering it: the answer is what we test
    transport = httpx.ASGITransport(app=_app(), raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://t")


async def test_errors_are_problem_documents_with_the_stable_code() -> None:
    async with _client() as c:
        r = await c.post("/q", json={"sql": "SELECT 1", "limit": "many"})
    assert r.status_code == 422
    assert r.headers["content-type"] == "application/problem+json"
    body = r.json()
    assert body["error"] == "invalid_request" and "limit" in body["detail"]
    assert body["type"] == "urn:dataplane:error:invalid_request"
    assert body["status"] == 422 and body["title"] == "Invalid request"


async def test_every_401_carries_a_bearer_challenge() -> None:
    async with _client() as c:
        none_sent = await c.get("/anonymous")
        refused = await c.get("/refused-token")
    assert (none_sent.status_code, none_sent.headers["www-authenticate"]) == (401, "Bearer")
    assert (refused.status_code, refused.headers["www-authenticate"]) == (401, 'Bearer error="invalid_token"')


async def test_request_id_echoed_when_sane_else_generated() -> None:
    async with _client() as c:
        echoed = await c.post("/q", json={"sql": "x"}, headers={"X-Request-ID": "req-42.a/b"})
        correlated = await c.get("/anonymous", headers={"X-Correlation-ID": "corr-7"})
        too_long = await c.post("/q", json={"sql": "x"}, headers={"X-Request-ID": "a" * 129})
        spaced = await c.post("/q", json={"sql": "x"}, headers={"X-Request-ID": "two words"})
        unknown = await c.get("/nowhere")
    assert echoed.headers["x-request-id"] == "req-42.a/b"
    assert correlated.headers["x-request-id"] == "corr-7"
    for fresh in (too_long, spaced, unknown):
        rid = fresh.headers["x-request-id"]
        assert len(rid) == 32 and int(rid, 16) >= 0, rid
    assert unknown.status_code == 404 and unknown.json()["error"] == "not_found"


async def test_an_unknown_field_is_named_with_the_expected_ones() -> None:
    async with _client() as c:
        r = await c.post("/q", json={"query": "SELECT 1"})
        odd = await c.post("/q", json={"sql": "x", "alice@example.org": 1})
    assert r.status_code == 422 and r.json()["error"] == "invalid_request"
    assert r.json()["detail"] == "invalid request: unknown field 'query' (expected: sql, limit)"
    # a key that does not read as a field name is not quoted back: it could be anything
    assert odd.status_code == 422 and "alice" not in odd.text


async def test_a_body_that_is_not_json_says_what_is_wrong() -> None:
    async with _client() as c:
        syntax = await c.post("/q", content=b'{"sql": ', headers={"content-type": "application/json"})
        not_utf8 = await c.post(
            "/q", content=b'{"sql": "\xff"}', headers={"content-type": "application/json"}
        )
        text = await c.post("/q", content=b"SELECT 1", headers={"content-type": "text/plain"})
        a_list = await c.post("/q", json=["SELECT 1"])
        empty = await c.post("/q", content=b"", headers=JSON)
    assert syntax.status_code == 400 and syntax.json()["error"] == "invalid_body"
    assert syntax.json()["detail"].startswith("invalid request: the body is not a JSON document: ")
    assert "at character 8" in syntax.json()["detail"]
    assert not_utf8.status_code == 400 and "UTF-8" in not_utf8.json()["detail"]
    assert text.status_code == 422 and "application/json" in text.json()["detail"]
    assert (
        a_list.status_code == 422
        and a_list.json()["detail"] == "invalid request: the body must be a JSON object"
    )
    assert empty.status_code == 422 and "empty" in empty.json()["detail"]


async def test_an_unexpected_fault_is_500_internal_error_with_the_request_id(
    capsys: pytest.CaptureFixture[str],
) -> None:
    async with _client() as c:
        sent = await c.get("/fault", headers={"X-Request-ID": "fault-1"})
        fresh = await c.get("/fault")
    assert sent.status_code == fresh.status_code == 500
    assert sent.headers["content-type"] == "application/problem+json"
    assert sent.headers["x-request-id"] == "fault-1"
    assert len(fresh.headers["x-request-id"]) == 32
    body = sent.json()
    assert body["error"] == "internal_error" and body["status"] == 500
    assert "did:web" not in sent.text and "eyJ" not in sent.text  # the fault's words stay ours
    logged = capsys.readouterr()
    assert "did:web:secret" not in logged.out + logged.err
