"""Typed service errors rendered once, as an RFC 9457 problem document (`application/problem+json`)
that keeps the project's own members: `{"type", "title", "status", "error": code, "detail": text}`
(docs/wire-contracts.md, "Errors"). Every 401 carries its `WWW-Authenticate` challenge."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from dataplane_contracts.errors import ErrorCode, status_of
from dataplane_service_kit.logs import get_logger
from dataplane_service_kit.request_ids import HEADER as REQUEST_ID
from dataplane_service_kit.request_ids import from_scope

PROBLEM_JSON = "application/problem+json"
# the problem `type` of a code: a stable URI naming it (RFC 9457 lets a type be a URN; clients
# key on it or on `error`, the same code)
PROBLEM_TYPE = "urn:dataplane:error:"
# 401s that mean "no credential was sent": RFC 6750 says such a challenge carries no error code
_NO_CREDENTIAL = frozenset({"auth_required", "no_token", "client_auth_required"})
_WORDS = {"sql": "SQL", "ds": "ds", "jwt": "JWT", "did": "DID"}

# pydantic's messages for these carry the model's bound only, never the input: safe to show
_BOUND_ERRORS = frozenset({"less_than_equal", "greater_than_equal", "less_than", "greater_than"})


class ServiceError(Exception):
    """An expected refusal: carries its stable code; the status comes from the contracts table."""

    def __init__(self, code: ErrorCode, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.status_code = status_of(code)
        self.headers = headers


def encodable(text: str) -> str:
    """The text with every lone surrogate replaced: JSONResponse encodes UTF-8 strictly, and a
    detail that quotes request text must never turn a refusal into a plain-text 500."""
    if text.isascii():
        return text
    return text.encode("utf-8", "replace").decode("utf-8")


def title_of(code: str) -> str:
    """The problem's `title`: the code in words, the same for every occurrence of the code."""
    words = [_WORDS.get(w, w) for w in code.split("_")]
    return " ".join([words[0][:1].upper() + words[0][1:], *words[1:]])


def challenge(code: str) -> str:
    """The `WWW-Authenticate` of a 401 (RFC 6750): a bare `Bearer` when no credential was sent,
    `error="invalid_token"` when the one sent was refused."""
    return "Bearer" if code in _NO_CREDENTIAL else 'Bearer error="invalid_token"'


def problem(code: str, status: int, detail: str) -> dict[str, object]:
    return {
        "type": PROBLEM_TYPE + code,
        "title": title_of(code),
        "status": status,
        "error": code,
        "detail": encodable(detail),
    }


def problem_response(
    code: str, status: int, detail: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    """The one rendering of a refusal, coded or the framework's own (404, 405)."""
    if status == 401 and not (headers and "WWW-Authenticate" in headers):
        headers = {**(headers or {}), "WWW-Authenticate": challenge(code)}
    return JSONResponse(
        problem(code, status, detail), status_code=status, headers=headers, media_type=PROBLEM_JSON
    )


def error_response(code: ErrorCode, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return problem_response(code, status_of(code), detail, headers)


# a field name a client sent is quoted only when it reads as an identifier: a key can be anything,
# and an error detail must never carry a principal, a key or a token
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


def _field_problem(error: Any, expected: tuple[str, ...]) -> str:
    where = ".".join(str(p) for p in error["loc"] if p != "body")
    kind = error.get("type")
    if kind == "extra_forbidden":
        name = str(error["loc"][-1])
        named = f"'{name}'" if _NAME.fullmatch(name) else "a field with an unreadable name"
        known = f" (expected: {', '.join(expected)})" if expected else ""
        return f"unknown field {named}{known}"
    if not where and kind in _NOT_AN_OBJECT:
        return "the body must be a JSON object"
    if not where and kind == "missing":
        return "the body is empty: a JSON object is expected"
    if kind in _BOUND_ERRORS:
        return f"{where} ({str(error['msg']).lower()})"
    return where


def validation_detail(errors: Sequence[Any], expected: tuple[str, ...] = ()) -> str:
    """The detail of a body the model refused: each field and what is wrong, never a value."""
    return "invalid request: " + ", ".join(sorted({_field_problem(e, expected) for e in errors}))


_NOT_AN_OBJECT = frozenset({"model_attributes_type", "dict_type", "model_type"})
NOT_JSON = "invalid request: the body is not a JSON document"
NOT_UTF8 = "invalid request: the body is not UTF-8 text, so not a JSON document"
NOT_JSON_MEDIA = "invalid request: the body must be a JSON object sent as application/json"


def _not_json(error: Any) -> str:
    """What is wrong with a body that does not parse: the parser's reason and where (a character
    offset), never the text itself."""
    reason = str((error.get("ctx") or {}).get("error", "")).strip()
    pos = error["loc"][-1] if len(error["loc"]) > 1 and isinstance(error["loc"][-1], int) else None
    if not reason:
        return NOT_JSON
    return f"{NOT_JSON}: {reason[:80].lower()}" + (f" at character {pos}" if pos is not None else "")


def _json_media(request: Request) -> bool:
    content_type = request.headers.get("content-type")
    if content_type is None:
        return True
    media = content_type.partition(";")[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def install_error_handlers(
    app: FastAPI,
    invalid_request_code: ErrorCode,
    undecodable_body_code: ErrorCode | None = None,
    *,
    expected_fields: tuple[str, ...] = (),
) -> None:
    """Render ServiceError and request validation failures; nothing else is swallowed. A body
    that is not a JSON document at all (not UTF-8, not JSON) answers `undecodable_body_code`
    when the service names one, else `invalid_request_code`. `expected_fields` are named when a
    body carries a field the route does not take."""
    not_json_code = undecodable_body_code or invalid_request_code

    async def on_service_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ServiceError)
        return error_response(exc.code, exc.detail, exc.headers)

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        # field locations (and a bound) only: the offending input values could be personal data
        errors = exc.errors()
        for e in errors:
            if e.get("type") == "json_invalid":
                return error_response(not_json_code, _not_json(e))
        if not _json_media(request):
            return error_response(invalid_request_code, NOT_JSON_MEDIA)
        return error_response(invalid_request_code, validation_detail(errors, expected_fields))

    async def on_http(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code in (404, 405):
            code = "not_found" if exc.status_code == 404 else "method_not_allowed"
            headers = dict(exc.headers) if exc.headers else None  # 405's Allow
            return problem_response(code, exc.status_code, str(exc.detail), headers)
        if exc.status_code == 413:  # the framework's own body limit, when a route sets one
            return error_response("body_too_large", "request body too large")
        # FastAPI's 400 for a body it could not read (not UTF-8, say): a malformed request like
        # any other, under the service's own code — never a routing error
        return error_response(not_json_code, NOT_UTF8)

    app.add_exception_handler(ServiceError, on_service_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    # behind the front door a fault that escaped is answered by the door (front_door.py); this
    # handler, in Starlette's outermost layer, codes the 500 of an app without one
    app.add_exception_handler(Exception, on_unexpected)


INTERNAL_DETAIL = "internal error; the request id names it in our logs"

log = get_logger(__name__)


def unexpected_response(exc: BaseException, rid: str) -> JSONResponse:
    """500 internal_error with the request's id. The log line names the exception's type only:
    its message or traceback could quote a statement, a principal or a token."""
    log.error("unhandled_error", error_type=type(exc).__name__, request_id=rid)
    return error_response("internal_error", INTERNAL_DETAIL, {REQUEST_ID: rid})


async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    return unexpected_response(exc, from_scope(request.scope))
