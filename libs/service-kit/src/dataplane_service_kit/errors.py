"""Typed service errors rendered once as {"error": code, "detail": text}."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from dataplane_contracts.errors import ErrorBody, ErrorCode, status_of

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


def error_response(code: ErrorCode, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
    body = ErrorBody(error=code, detail=encodable(detail))
    return JSONResponse(body.model_dump(mode="json"), status_code=status_of(code), headers=headers)


def _field_problem(error: Any) -> str:
    if error.get("type") == "json_invalid":
        return "the body is not a JSON document"
    where = ".".join(str(p) for p in error["loc"] if p != "body")
    if error.get("type") in _BOUND_ERRORS:
        return f"{where} ({str(error['msg']).lower()})"
    return where


NOT_JSON = "invalid request: the body is not a JSON document"


def install_error_handlers(
    app: FastAPI, invalid_request_code: ErrorCode, undecodable_body_code: ErrorCode | None = None
) -> None:
    """Render ServiceError and request validation failures; nothing else is swallowed. A body
    that is not a JSON document at all (not UTF-8, not JSON) answers `undecodable_body_code`
    when the service names one, else `invalid_request_code`."""
    not_json_code = undecodable_body_code or invalid_request_code

    async def on_service_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ServiceError)
        return error_response(exc.code, exc.detail, exc.headers)

    async def on_validation(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        # field locations (and a bound) only: the offending input values could be personal data
        errors = exc.errors()
        if any(e.get("type") == "json_invalid" for e in errors):
            return error_response(not_json_code, NOT_JSON)
        fields = sorted({_field_problem(e) for e in errors})
        return error_response(invalid_request_code, "invalid request: " + ", ".join(fields))

    async def on_http(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code in (404, 405):
            code = "not_found" if exc.status_code == 404 else "method_not_allowed"
            return JSONResponse({"error": code, "detail": str(exc.detail)}, status_code=exc.status_code)
        if exc.status_code == 413:  # the framework's own body limit, when a route sets one
            return error_response("body_too_large", "request body too large")
        # FastAPI's 400 for a body it could not read (not UTF-8, say): a malformed request like
        # any other, under the service's own code — never a routing error
        return error_response(not_json_code, NOT_JSON)

    app.add_exception_handler(ServiceError, on_service_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
