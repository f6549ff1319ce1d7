"""A bound on the request body, enforced before any route decodes it."""

from __future__ import annotations

from collections.abc import Callable

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dataplane_service_kit.errors import error_response


class BodyLimit:
    """ASGI middleware: a request body above `max_bytes` is answered 413 `body_too_large`.

    A declared Content-Length above the limit is refused before one byte is read; any other body
    (chunked, or a Content-Length that understates it) is counted as it arrives and refused as
    soon as the count passes the limit, so at most `max_bytes` plus one chunk is ever held. The
    accepted body is replayed to the app whole: FastAPI decodes and validates a body before the
    handler runs, so a limit inside a handler would come after the cost it is meant to bound.
    `refused` sees the scope of each refused request (the service's metrics and records)."""

    def __init__(self, app: ASGIApp, max_bytes: int, refused: Callable[[Scope], None] | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.refused = refused

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away before its body was complete: nobody to answer
            chunk: bytes = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body: Message | None = {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        async def replay() -> Message:
            nonlocal body
            if body is None:
                return await receive()  # after the body: the disconnect, as the server sends it
            message, body = body, None
            return message

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.refused is not None:
            self.refused(scope)
        response = error_response("body_too_large", f"request body larger than {self.max_bytes} bytes")
        await response(scope, receive, send)


def _content_length(scope: Scope) -> int | None:
    value = Headers(scope=scope).get("content-length")
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None  # the server refuses a malformed length itself; the count still applies
