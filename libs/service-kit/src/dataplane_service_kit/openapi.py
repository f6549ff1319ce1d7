"""OpenAPI documentation of what the service kit renders: the error body per status with the codes
a route may answer, and the `/healthz` `/readyz` `/metrics` answers. Declarations only: a route's
`responses=` is read when the document is built, never per request."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import metadata
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from dataplane_contracts.errors import STATUS
from dataplane_service_kit.errors import PROBLEM_JSON, PROBLEM_TYPE

# what the framework itself answers besides the contracts table (errors.py renders both)
FRAMEWORK_CODES: dict[str, int] = {"not_found": 404, "method_not_allowed": 405}

_REASONS: dict[int, str] = {
    400: "the request cannot be served as sent",
    401: "no valid credential",
    403: "the credential is valid; the request is refused",
    404: "no such resource",
    409: "conflicts with the resource's state",
    413: "the body is over the service's limit",
    422: "the body or a parameter does not validate",
    429: "the consumer is over its rate; retry after `Retry-After` seconds",
    500: "a row filter cannot be applied as declared",
    502: "an upstream answered what cannot be read",
    503: "a dependency cannot be reached now; retry later",
}


def distribution_version(name: str) -> str:
    """The installed distribution's version, the document's `info.version`."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:  # a source tree without the distribution installed
        return "0"


def error_schema(codes: tuple[str, ...], status: int | None = None) -> dict[str, Any]:
    """The RFC 9457 problem document with the codes this answer may carry (errors.py)."""
    return {
        "type": "object",
        "required": ["type", "title", "status", "error", "detail"],
        "additionalProperties": False,
        "properties": {
            "type": {"type": "string", "enum": [PROBLEM_TYPE + c for c in codes]},
            "title": {"type": "string", "description": "the code in words"},
            "status": {"const": status} if status is not None else {"type": "integer"},
            "error": {"type": "string", "enum": list(codes), "description": "the stable code"},
            "detail": {"type": "string", "description": "for people; never a principal, key or token"},
        },
    }


def error_responses(
    *codes: str, headers: Mapping[int, Mapping[str, Any]] | None = None
) -> dict[int | str, dict[str, Any]]:
    """The `responses=` entries of a route's refusals, one per status, each naming its codes,
    each with `X-Request-ID` (and a 401 with its challenge). A code outside the contracts table
    and the framework's own is a mistake of the caller."""
    by_status: dict[int, list[str]] = {}
    for code in dict.fromkeys(codes):  # a code listed twice is documented once
        status = STATUS.get(code) or FRAMEWORK_CODES.get(code)
        if status is None:
            raise ValueError(f"unknown error code {code!r}")
        by_status.setdefault(status, []).append(code)
    out: dict[int | str, dict[str, Any]] = {}
    for status in sorted(by_status):
        listed = tuple(by_status[status])
        entry: dict[str, Any] = {
            "description": f"{_REASONS.get(status, 'refused')}: " + ", ".join(f"`{c}`" for c in listed),
            "content": {PROBLEM_JSON: {"schema": error_schema(listed, status)}},
        }
        entry["headers"] = {
            **REQUEST_ID,
            **(BEARER_CHALLENGE if status == 401 else {}),
            **((headers or {}).get(status) or {}),
        }
        out[status] = entry
    return out


def openapi_document(
    app: FastAPI,
    exact: tuple[type[BaseModel], ...] = (),
    security_schemes: Mapping[str, Any] | None = None,
) -> Callable[[], dict[str, Any]]:
    """An `app.openapi` built once, at the first request for the document. The `exact` models'
    schemas are taken as pydantic writes them: FastAPI's document model reads every bound as a
    float, so a bound of 2**63 - 1 would be documented as 2**63."""

    def document() -> dict[str, Any]:
        if app.openapi_schema is None:
            built = get_openapi(
                title=app.title,
                version=app.version,
                summary=app.summary,
                description=app.description,
                routes=app.routes,
                # relative: the service where the document is read, behind whatever host serves it
                servers=[{"url": "/", "description": "this service, where the document is served"}],
            )
            _without_framework_422(built)
            components = built.setdefault("components", {})
            schemas = components.get("schemas", {})
            for model in exact:
                if model.__name__ in schemas:
                    schemas[model.__name__] = model.model_json_schema(ref_template=_REF)
            if security_schemes:
                components["securitySchemes"] = dict(security_schemes)
            app.openapi_schema = built
        return app.openapi_schema

    return document


_REF = "#/components/schemas/{model}"
_FRAMEWORK_422 = "#/components/schemas/HTTPValidationError"


def _without_framework_422(document: dict[str, Any]) -> None:
    """FastAPI documents its own 422 body on every route with a parameter; our services never
    answer it (errors.py renders a validation failure as the error body), and each route that can
    fail validation declares its own 422."""
    for operations in document.get("paths", {}).values():
        for operation in operations.values():
            answer = operation.get("responses", {}).get("422", {})
            if answer.get("content", {}).get("application/json", {}).get("schema", {}).get("$ref") == (
                _FRAMEWORK_422
            ):
                del operation["responses"]["422"]
    schemas = document.get("components", {}).get("schemas", {})
    schemas.pop("HTTPValidationError", None)
    schemas.pop("ValidationError", None)


REQUEST_ID = {
    "X-Request-ID": {
        "required": True,
        "description": "the caller's `X-Request-ID` (else `X-Correlation-ID`) when it is 1 to 128 "
        "visible ASCII characters, else a new id; the id of the request's records",
        "schema": {"type": "string"},
    }
}

BEARER_CHALLENGE = {
    "WWW-Authenticate": {
        "description": '`Bearer` when no credential was sent, `Bearer error="invalid_token"` when the '
        "one sent was refused (RFC 6750)",
        "required": True,
        "schema": {"type": "string"},
    },
}

_STRINGS = {"type": "array", "items": {"type": "string"}}

HEALTHZ_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "the process is alive",
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["status"],
                    "properties": {"status": {"const": "ok"}},
                }
            }
        },
    }
}

READYZ_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "every required dependency answered; `degraded` names lost capabilities",
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["status"],
                    "properties": {"status": {"const": "ready"}, "degraded": _STRINGS},
                }
            }
        },
    },
    503: {
        "description": "a required dependency did not answer: `failing` names it (never its URL)",
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["status", "error", "failing"],
                    "properties": {
                        "status": {"const": "unready"},
                        "error": {"const": "not_ready"},
                        "failing": _STRINGS,
                        "degraded": _STRINGS,
                    },
                }
            }
        },
    },
}

METRICS_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "Prometheus text exposition format",
        "content": {"text/plain": {"schema": {"type": "string"}}},
    }
}
