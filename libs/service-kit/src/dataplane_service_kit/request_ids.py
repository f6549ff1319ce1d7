"""`X-Request-ID` on every answer (docs/operations.md, "Request ids"): a sane id the caller sent
is echoed, anything else is replaced by a fresh one. An id names a request, not a person: it is
logged with the request's records and returned as sent."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADER = "X-Request-ID"
_RAW_HEADER = b"x-request-id"
# visible ASCII, no spaces, at most 128 characters: what every proxy and log line carries intact
_SANE = re.compile(r"[\x21-\x7e]{1,128}")


def request_id(sent: str | None) -> str:
    """The caller's id when it is sane, else a new one (32 hex digits)."""
    if sent is not None and _SANE.fullmatch(sent):
        return sent
    return uuid.uuid4().hex


def from_scope(scope: Scope) -> str:
    """The request's id, decided once per request and kept in the scope's state (where
    `request.state.request_id` reads it)."""
    state = scope.setdefault("state", {})
    known = state.get("request_id")
    if isinstance(known, str):
        return known
    rid = request_id(_sent(scope.get("headers", ())))
    state["request_id"] = rid
    return rid


def _sent(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    fallback = None
    for name, value in headers:
        lowered = name.lower()
        if lowered == _RAW_HEADER:
            return value.decode("latin-1")
        if lowered == b"x-correlation-id" and fallback is None:
            fallback = value.decode("latin-1")
    return fallback


def with_request_id(send: Send, rid: str) -> Send:
    """`send` with the id added to the answer's head, unless the app already set one."""
    value = rid.encode("latin-1")

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = list(message.get("headers", ()))
            if not any(name.lower() == _RAW_HEADER for name, _ in headers):
                headers.append((_RAW_HEADER, value))
                message = {**message, "headers": headers}
        await send(message)

    return sending


class RequestIds:
    """Plain ASGI: every HTTP answer carries the request's id (a service without a front door
    of its own; the gateway's door does the same for what it passes on)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.app(scope, receive, with_request_id(send, from_scope(scope)))
