"""Typed service errors rendered once as {"error": code, "detail": text}."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from dataplane_contracts.errors import ErrorBody, ErrorCode, status_of


class ServiceError(Exception):
    """An expected refusal: carries its stable code; the status comes from the contracts table."""

    def __init__(self, code: ErrorCode, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.status_code = status_of(code)
        self.headers = headers


def error_response(code: ErrorCode, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
    body = ErrorBody(error=code, detail=detail)
    return JSONResponse(body.model_dump(mode="json"), status_code=status_of(code), headers=headers)


def install_error_handlers(app: FastAPI, invalid_request_code: ErrorCode) -> None:
    """Render ServiceError and request validation failures; nothing else is swallowed."""

    async def on_service_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ServiceError)
        return error_response(exc.code, exc.detail, exc.headers)

    async def on_validation(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        # field locations only: the offending input values could be personal data
        fields = sorted({".".join(str(p) for p in e["loc"] if p != "body") for e in exc.errors()})
        body = ErrorBody(error=invalid_request_code, detail="invalid request: " + ", ".join(fields))
        return JSONResponse(body.model_dump(mode="json"), status_code=status_of(invalid_request_code))

    async def on_http(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        code = "not_found" if exc.status_code == 404 else "method_not_allowed"
        return JSONResponse({"error": code, "detail": str(exc.detail)}, status_code=exc.status_code)

    app.add_exception_handler(ServiceError, on_service_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
