"""Issue 20 (hot path): the query routes have two front doors — `QueryRoutes`, plain ASGI, for a
well-formed JSON body, and the FastAPI routes for everything it passes on. A client cannot tell
them apart: the same request answers the same through either (QE-01's answer and its refusals),
and what the plain door must not decide reaches FastAPI with its body intact."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from starlette.types import Message, Receive, Scope, Send

from query_gateway.routes import QueryRoutes

PUBLIC_SQL = "SELECT id FROM stats ORDER BY id"
# the plain door answers the first three; FastAPI decodes the last as JSON too (a +json subtype)
PLAIN = ("application/json", "application/json; charset=utf-8", None)
FRAMEWORK = "application/vnd.dataplane+json"


async def _post(client: httpx.AsyncClient, body: dict[str, Any], content_type: str | None) -> httpx.Response:
    headers = {"X-Request-ID": "req-door"}
    if content_type is not None:
        headers["content-type"] = content_type
    return await client.post("/query", content=json.dumps(body).encode(), headers=headers)


def _answer(r: httpx.Response) -> tuple[int, str, Any, str | None]:
    return r.status_code, r.headers["content-type"], r.json(), r.headers.get("x-request-id")


@pytest.mark.parametrize(
    "body",
    [
        {"sql": PUBLIC_SQL, "limit": 2},
        {"sql": PUBLIC_SQL, "limit": 2, "offset": 1, "skip_count": True, "unknown": 1},
        {"sql": "   "},  # sql_refused: missing statement
        {"sql": "DELETE FROM stats"},  # a refused statement
        {"sql": "SELECT id FROM nowhere"},  # an unknown table
    ],
)
async def test_qe01_both_doors_answer_alike(client: httpx.AsyncClient, body: dict[str, Any]) -> None:
    framework = _answer(await _post(client, body, FRAMEWORK))
    for content_type in PLAIN:
        assert _answer(await _post(client, body, content_type)) == framework, content_type
    if framework[0] == 200:
        assert framework[2]["items"] and framework[3] == "req-door"


async def test_qe01_malformed_bodies_keep_the_framework_answer(client: httpx.AsyncClient) -> None:
    """Bodies the plain door passes on: FastAPI's refusal, the service's code, as before."""
    not_json = await client.post("/query", content=b"{not json", headers={"content-type": "application/json"})
    assert (not_json.status_code, not_json.json()["error"]) == (400, "invalid_body")
    wrong_type = await client.post("/query", json={"sql": PUBLIC_SQL, "limit": "many"})
    assert (wrong_type.status_code, wrong_type.json()["error"]) == (422, "invalid_request")
    assert "limit" in wrong_type.json()["detail"]
    a_list = await client.post("/query", json=[PUBLIC_SQL])
    assert (a_list.status_code, a_list.json()["error"]) == (422, "invalid_request")
    text = await client.post("/query", content=PUBLIC_SQL.encode(), headers={"content-type": "text/plain"})
    assert (text.status_code, text.json()["error"]) == (422, "invalid_request")
    wrong_method = await client.get("/query")
    assert wrong_method.status_code == 405


class _Inner:
    """The app behind the plain door: records what it was handed, answers 204."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, bytes]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        self.seen.append((scope["path"], body))
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})


async def _through(door: QueryRoutes, path: str, chunks: list[bytes], content_type: bytes) -> None:
    messages: list[Message] = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)
    ]

    async def receive() -> Message:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(_: Message) -> None:
        return None

    headers = [(b"content-type", content_type)]
    scope: Scope = {"type": "http", "method": "POST", "path": path, "headers": headers}
    await door(scope, receive, send)


async def test_qe01_plain_door_passes_on_what_it_must_not_decide() -> None:
    inner = _Inner()
    door = QueryRoutes(inner, dps_enabled=False)
    await _through(door, "/query", [b'{"sql": ', b'"SELECT 1", "limit": "x"}'], b"application/json")
    await _through(door, "/query", [b"[1]"], b"application/json")
    await _through(door, "/query", [b'{"sql": "SELECT 1"}'], b"application/problem+json")
    await _through(door, "/query", [b""], b"application/json")
    # DPS-01: without DPS the pull route is not the plain door's, whatever its body
    await _through(door, "/dps/public/query", [b'{"sql": "SELECT 1"}'], b"application/json")
    assert inner.seen == [
        ("/query", b'{"sql": "SELECT 1", "limit": "x"}'),
        ("/query", b"[1]"),
        ("/query", b'{"sql": "SELECT 1"}'),
        ("/query", b""),
        ("/dps/public/query", b'{"sql": "SELECT 1"}'),
    ]
