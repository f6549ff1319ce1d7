"""What every gateway answer carries (docs/gateway.md, "QE-01"): QE-01's problem
documents with `error` and `detail`, `WWW-Authenticate` on each 401, `X-Request-ID` on every
answer through either front door, authentication before the statement is read, an unknown body
field refused by name, a clamped `limit` signalled by `X-Limit-Clamped`."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest

from dataplane_testing.gateway import AGREEMENT, CATALOGUE, World, running_gateway

STATS = "SELECT id FROM stats ORDER BY id"
# a catalogue whose every dataset needs a caller: nothing is read without a bearer
ONLY_INTERNAL = "datasets:\n" + CATALOGUE.read_text().split("datasets:\n", 1)[1].split("  - id: stats", 1)[0]


async def test_qe01_every_answer_carries_a_request_id(client: httpx.AsyncClient) -> None:
    sent = {"X-Request-ID": "trace-me-42"}
    answers = [
        await client.post("/query", json={"sql": STATS}, headers=sent),  # the plain door
        await client.post("/query", json={"sql": "DELETE FROM stats"}, headers=sent),  # its refusal
        await client.post("/query", json={"sql": STATS, "limit": "x"}, headers=sent),  # FastAPI's 422
        await client.post("/query", content=b"{", headers={**sent, "content-type": "application/json"}),
        await client.get("/healthz", headers=sent),
        await client.get("/nowhere", headers=sent),
    ]
    assert [r.headers.get("x-request-id") for r in answers] == ["trace-me-42"] * len(answers)
    fresh = await client.post("/query", json={"sql": "DELETE FROM stats"}, headers={"X-Request-ID": "a b"})
    assert fresh.headers["x-request-id"] != "a b" and len(fresh.headers["x-request-id"]) == 32


async def test_qe01_refusals_are_problem_documents(client: httpx.AsyncClient) -> None:
    r = await client.post("/query", json={"sql": "DELETE FROM stats"})
    assert r.status_code == 400 and r.headers["content-type"] == "application/problem+json"
    body = r.json()
    assert (body["error"], body["status"], body["type"]) == (
        "sql_refused",
        400,
        "urn:dataplane:error:sql_refused",
    )
    assert body["title"] == "SQL refused" and body["detail"]


async def test_qe01_every_401_carries_a_bearer_challenge(client: httpx.AsyncClient, world: World) -> None:
    notes = await client.post("/query", json={"sql": "SELECT id FROM readings"})  # needs a caller
    assert (notes.status_code, notes.json()["error"]) == (401, "auth_required")
    assert notes.headers["www-authenticate"] == "Bearer"
    bad = await client.post("/query", json={"sql": STATS}, headers={"Authorization": "Bearer junk"})
    assert (bad.status_code, bad.json()["error"]) == (401, "invalid_token")
    assert bad.headers["www-authenticate"] == 'Bearer error="invalid_token"'
    edr = await client.post(
        "/query",
        json={"sql": STATS},
        headers={"Authorization": "Bearer junk", "Edc-Contract-Agreement-Id": AGREEMENT},
    )
    assert edr.status_code == 401 and edr.headers["www-authenticate"].startswith("Bearer")


async def test_qe01_basic_credentials_get_the_challenge_of_no_bearer_without_an_error_code(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    """RFC 6750, 3.1: a request that carries no bearer (here another scheme) is answered with a
    bare `Bearer` challenge; `error="invalid_token"` is for a bearer that was sent and refused."""
    caplog.set_level(logging.INFO)
    r = await client.post("/query", json={"sql": STATS}, headers={"Authorization": "Basic dXNlcjpwYXNz"})
    assert (r.status_code, r.json()["error"]) == (401, "auth_required")
    assert r.headers["www-authenticate"] == "Bearer"
    assert "dXNlcjpwYXNz" not in caplog.text and "dXNlcjpwYXNz" not in r.text


async def test_qe01_without_a_bearer_authentication_comes_before_the_statement(
    world: World, tmp_path: Path
) -> None:
    path = tmp_path / "internal-only.yaml"
    path.write_text(ONLY_INTERNAL)
    async with running_gateway(world.settings(catalogue_path=str(path))) as c:
        for sql in ("SELEC nonsense", "SELECT id FROM nowhere", "SELECT secret_column FROM readings"):
            r = await c.post("/query", json={"sql": sql})
            assert (r.status_code, r.json()["error"]) == (401, "auth_required"), sql
            assert r.headers["www-authenticate"] == "Bearer"
        # with a bearer, the statement is judged as before
        token = world.user_token()
        judged = await c.post(
            "/query", json={"sql": "SELEC nonsense"}, headers={"Authorization": f"Bearer {token}"}
        )
        assert (judged.status_code, judged.json()["error"]) == (400, "sql_refused")


async def test_qe01_an_unknown_field_is_refused_naming_it_and_sql(client: httpx.AsyncClient) -> None:
    for content_type in ("application/json", "application/vnd.dataplane+json"):
        r = await client.post(
            "/query", content=b'{"query": "SELECT id FROM stats"}', headers={"content-type": content_type}
        )
        assert (r.status_code, r.json()["error"]) == (422, "invalid_request")
        assert r.json()["detail"] == (
            "invalid request: unknown field 'query' (expected: sql, limit, offset, skip_count)"
        )


async def test_qe01_a_clamped_limit_is_signalled(client: httpx.AsyncClient) -> None:
    asked = await client.post("/query", json={"sql": STATS, "limit": 1})
    assert asked.status_code == 200 and "x-limit-clamped" not in asked.headers
    capped = await client.post("/query", json={"sql": STATS, "limit": 20_000})
    assert capped.json()["limit"] == 10_000 and capped.headers["x-limit-clamped"] == "20000"
    zero = await client.post("/query", json={"sql": STATS, "limit": 0})
    assert zero.json()["limit"] == 100 and zero.headers["x-limit-clamped"] == "0"
