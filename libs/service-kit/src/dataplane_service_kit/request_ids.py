"""What the front door reads of every request, once (docs/operations.md, "The front door"): its
headers, and its `X-Request-ID` — a sane id the caller sent is echoed, anything else is replaced
by a fresh one per request. An id names a request, not a person: it is logged with the request's
records and returned as sent."""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from starlette.types import Scope

HEADER = "X-Request-ID"
RAW_HEADER = b"x-request-id"
# visible ASCII, no spaces, at most 128 characters: what every proxy and log line carries intact
_SANE = re.compile(r"[\x21-\x7e]{1,128}")
# where the door keeps what it read, in the request's own state (`request.state.incoming`); the
# state of one request only: a server copies its lifespan state into each request's scope
_KEY = "incoming"


def request_id(sent: str | None) -> str:
    """The caller's id when it is sane, else a new one (32 hex digits)."""
    if sent is not None and _SANE.fullmatch(sent):
        return sent
    return uuid.uuid4().hex


@dataclass(frozen=True, slots=True)
class Incoming:
    """A request's headers — lower-case names, latin-1, the first value of a repeated name (as
    FastAPI's `Header()` reads them) — and the id its answer, records and span carry."""

    headers: Mapping[str, str]
    request_id: str


def read_headers(scope: Scope) -> dict[str, str]:
    """The one header reader every route uses (through `incoming_of`)."""
    headers: dict[str, str] = {}
    for name, value in scope.get("headers", ()):
        key = name.decode("latin-1").lower()
        if key not in headers:
            headers[key] = value.decode("latin-1")
    return headers


def admit(scope: Scope) -> Incoming:
    """Read the request once and keep it in the request's state; always a fresh decision, so an
    id can never be carried over from another scope (the lifespan's state, say)."""
    headers = read_headers(scope)
    sent = headers.get("x-request-id")
    incoming = Incoming(headers, request_id(headers.get("x-correlation-id") if sent is None else sent))
    scope.setdefault("state", {})[_KEY] = incoming
    return incoming


def incoming_of(scope: Scope) -> Incoming:
    """What the door read of this request (read now when no door ran, as in a bare app)."""
    known = scope.get("state", {}).get(_KEY)
    if isinstance(known, Incoming):
        return known
    return admit(scope)


def from_scope(scope: Scope) -> str:
    """The request's id."""
    return incoming_of(scope).request_id
