"""Signaling's control-plane routes bound the request body (issue 33): a 60 MB body is refused
`413 body_too_large` before it is read whole — a declared length at once, a chunked body as soon
as its count passes SIGNALING_MAX_BODY_BYTES — and nothing is created; a message under the bound
is read as before."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from dataplane_testing.signaling import FLOWS, auth, new_id, start_message

SIXTY_MB = 60 * 1024 * 1024
CHUNK = 64 * 1024


async def test_a_60_mb_body_with_its_length_declared_is_refused_413(signaling: Any, cp_token: Any) -> None:
    r = await signaling.client.post(
        f"{FLOWS}/prepare",
        content=b"{" + b" " * (SIXTY_MB - 2) + b"}",
        headers={**auth(cp_token()), "Content-Type": "application/json"},
    )
    assert r.status_code == 413, r.text
    assert r.json()["error"] == "body_too_large" and "X-Request-ID" in r.headers


async def test_a_60_mb_chunked_body_is_refused_before_it_is_read_whole(signaling: Any, cp_token: Any) -> None:
    sent = 0

    async def body() -> AsyncIterator[bytes]:
        nonlocal sent
        while sent < SIXTY_MB:
            sent += CHUNK
            yield b" " * CHUNK

    flow = new_id()
    r = await signaling.client.post(
        f"{FLOWS}/prepare", content=body(), headers={**auth(cp_token()), "Content-Type": "application/json"}
    )
    assert r.status_code == 413, r.text
    assert r.json()["error"] == "body_too_large"
    assert sent <= signaling.settings.signaling_max_body_bytes + 2 * CHUNK, (
        sent
    )  # read to the bound and a chunk past it, not 60 MB
    # and a message under the bound is served
    r = await signaling.client.post(f"{FLOWS}/prepare", json=start_message(flow), headers=auth(cp_token()))
    assert r.status_code in (200, 201), r.text
