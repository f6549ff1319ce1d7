"""A bound on the request body, enforced by the front door before any route decodes it: FastAPI
decodes and validates a body before the handler runs, so a limit inside a handler would come after
the cost it is meant to bound."""

from __future__ import annotations

from starlette.types import Message, Receive, Scope


class BodyTooLarge(Exception):
    """The body passes the bound (answered 413 `body_too_large`)."""


async def bounded_body(scope: Scope, receive: Receive, max_bytes: int) -> bytes | None:
    """The whole body, or None when the client went away before it was complete (nobody to
    answer). A declared Content-Length above the bound is refused before one byte is read; any
    other body (chunked, or a length that understates it) is counted as it arrives and refused as
    soon as the count passes the bound, so at most `max_bytes` plus one chunk is ever held."""
    declared = _content_length(scope)
    if declared is not None and declared > max_bytes:
        raise BodyTooLarge
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > max_bytes:
            raise BodyTooLarge
        if not message.get("more_body", False):
            if not chunks:
                return chunk
            chunks.append(chunk)
            return b"".join(chunks)
        chunks.append(chunk)


def replayed(first: Message | bytes, receive: Receive) -> Receive:
    """A message already read (or a whole body, as one message), then what the server sends
    after it (the rest of the body, the disconnect)."""
    if isinstance(first, bytes):
        first = {"type": "http.request", "body": first, "more_body": False}
    pending: Message | None = first

    async def replay() -> Message:
        nonlocal pending
        if pending is None:
            return await receive()
        message, pending = pending, None
        return message

    return replay


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the server refuses a malformed length itself; the count still applies
    return None
