"""HTTP routes: `POST /query` (normal path, or the legacy EDR path in dataspace mode),
`POST /query/plan` (normal path only) and `POST /dps/public/query` (DPS-09).

Each route is one `answer_*` function over the request's headers and body. Two front doors call
them: `QueryRoutes`, plain ASGI in front of the whole FastAPI app, which serves every well-formed
request without FastAPI's middleware, router, dependency resolution and request objects, and
starts the request's server span itself; and the FastAPI routes, which see only what
`QueryRoutes` passes on — a body that is not a JSON object of the expected fields, another
content type, a body over the limit — so every refusal of a malformed request keeps the
framework's rendering exactly."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dataplane_service_kit.authorization import bearer
from dataplane_service_kit.errors import ServiceError, error_response, unexpected_response, validation_detail
from dataplane_service_kit.request_ids import HEADER, from_scope, with_request_id
from dataplane_service_kit.telemetry import ServerSpans, answered
from query_gateway import openapi as api
from query_gateway.deps import (
    AgreementHeader,
    AuthorizationHeader,
    Headers,
    PullAuthorizationHeader,
    PurposeHeader,
    TransferHeader,
    caller_of,
    context,
    dataspace_request,
    guarded,
    pull_grant,
    pull_request,
    token_check,
)
from query_gateway.metrics import Metrics
from query_gateway.pipeline import QueryBody, explain_normal, run_dataspace, run_normal
from query_gateway.records.frozen import frozen_of
from query_gateway.records.request import RequestRefused, has_filter
from query_gateway.state import Gateway, gateway_of

Answer = Callable[[Gateway, Headers, QueryBody], Awaitable[Response]]


# ---------------------------------------------------------------------- the routes, once
async def answer_query(gw: Gateway, headers: Headers, body: QueryBody) -> Response:
    ctx = context(headers, "POST", "/query")
    authorization = headers.get("authorization")
    agreement = headers.get("edc-contract-agreement-id", "").strip()
    if gw.settings.edr_enabled and agreement:
        # dataspace mode: the bearer is an EDR token and never reaches the OIDC issuer

        async def edr() -> dict[str, object]:
            identity = await token_check(
                ctx, gw.connector.verify_edr(bearer(authorization) if authorization else None)
            )
            req = dataspace_request(
                consumer=identity.consumer,
                provider=identity.provider,
                connector_base=identity.base_url,
                agreement_id=agreement,
                transfer=headers.get("edc-transfer-process-id"),
                purpose=headers.get("edc-purpose"),
            )
            return await run_dataspace(gw, body, req, ctx)

        return await guarded(gw, "/query", ctx, edr, body.limit)

    async def normal() -> dict[str, object]:
        return await run_normal(gw, body, await caller_of(gw, authorization, ctx), ctx)

    return await guarded(gw, "/query", ctx, normal, body.limit)


async def answer_plan(gw: Gateway, headers: Headers, body: QueryBody) -> Response:
    ctx = context(headers, "POST", "/query/plan")

    async def explain() -> dict[str, object]:
        return await explain_normal(gw, body, await caller_of(gw, headers.get("authorization"), ctx), ctx)

    return await guarded(gw, "/query/plan", ctx, explain, None)


async def answer_pull(gw: Gateway, headers: Headers, body: QueryBody) -> Response:
    ctx = context(headers, "POST", "/dps/public/query")

    async def pull() -> dict[str, object]:
        grant = await pull_grant(
            gw,
            headers.get("authorization"),
            headers.get("edc-contract-agreement-id", "").strip() or None,
            ctx,
        )
        if grant.grant_extensions is not None:
            # a malformed frozen filter set refuses the grant (docs/records.md)
            frozen_of(grant.grant_extensions, grant.dataset_id)
        req = pull_request(gw, grant, headers.get("edc-transfer-process-id"), headers.get("edc-purpose"))
        return await run_dataspace(gw, body, req, ctx)

    return await guarded(gw, "/dps/public/query", ctx, pull, body.limit)


def _routes(dps_enabled: bool) -> dict[str, Answer]:
    routes: dict[str, Answer] = {"/query": answer_query, "/query/plan": answer_plan}
    if dps_enabled:  # DPS-01: the pull route exists only on a DPS data plane
        routes["/dps/public/query"] = answer_pull
    return routes


def body_refusals(dps_enabled: bool, metrics: Metrics) -> Callable[[Scope], None]:
    """What a body over QUERY_MAX_BODY_BYTES leaves (refused by the service kit's `BodyLimit`
    before any route ran): the request's metric and its access record, as for any refusal."""
    routes = set(_routes(dps_enabled))

    def refused(scope: Scope) -> None:
        route = scope.get("path", "")
        if route in routes:
            rid = from_scope(scope)
            context(_headers(scope), scope.get("method", "POST"), route, rid).failed("body_too_large", 413)
            metrics.requests.labels(route, "413", "body_too_large").inc()

    return refused


# ---------------------------------------------------------------------- plain ASGI front door
def _headers(scope: Scope) -> dict[str, str]:
    """The request's headers as FastAPI's `Header()` reads them: latin-1, the first of a repeat."""
    headers: dict[str, str] = {}
    for name, value in scope.get("headers", ()):
        key = name.decode("latin-1").lower()
        if key not in headers:
            headers[key] = value.decode("latin-1")
    return headers


def _json_media(content_type: str | None) -> bool:
    """No content type, or exactly JSON's: the two cases in which FastAPI decodes a JSON body.
    Any other (a `+json` subtype among them) is left to FastAPI and decided there."""
    if content_type is None:
        return True
    return content_type.partition(";")[0].strip().lower() == "application/json"


_FIELDS = tuple(QueryBody.model_fields)


def _well_formed(raw: bytes, headers: Headers, max_bytes: int | None = None) -> QueryBody | Response | None:
    """The body as FastAPI would bind it; the refusal of a JSON object whose only fault is a field
    the body does not take (FastAPI's words: `validation_detail`); None for anything else FastAPI
    would refuse or decide differently (not JSON, an empty body, one over the limit, a JSON value
    orjson reads otherwise, a field error)."""
    if not raw or not _json_media(headers.get("content-type")):
        return None
    if max_bytes is not None and len(raw) > max_bytes:
        return None
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(value, dict):
        return None
    try:
        return QueryBody.model_validate(value)
    except ValidationError as exc:
        errors = exc.errors()
        if all(e["type"] == "extra_forbidden" for e in errors):
            return error_response("invalid_request", validation_detail(errors, _FIELDS))
        return None


class QueryRoutes:
    """The gateway's outermost ASGI layer: a well-formed POST to a query route is answered here,
    with a server span of its own (`ServerSpans`) — no framework middleware, routing, dependency
    resolution or request objects; everything else — other routes and methods, a body FastAPI
    must refuse in its own words, a body over `max_bytes` — goes on to `app` (the FastAPI app
    with its middleware, its body limit and its instrumentation) with what was read replayed."""

    def __init__(
        self,
        app: ASGIApp,
        dps_enabled: bool,
        *,
        max_bytes: int | None = None,
        spans: ServerSpans | None = None,
        state: Any = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.app = app
        self.routes = _routes(dps_enabled)
        self.max_bytes = max_bytes
        self.spans = spans or ServerSpans({"OTEL_SDK_DISABLED": "true"})
        self.state = state  # where `gateway` is set by the lifespan (the FastAPI app's state)
        self.metrics = metrics if metrics is not None else Metrics()  # the app's (request durations)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        answer = self.routes.get(scope["path"]) if scope["type"] == "http" else None
        if (
            answer is None
            or scope["method"] != "POST"
            or self._declared_too_large(scope)
            # a client filter on the pull query is refused by the framework's route
            or (scope["path"] == "/dps/public/query" and has_filter(scope.get("query_string", b"")))
        ):
            await self.app(scope, receive, with_request_id(send, from_scope(scope)))
            return
        read = await _read_body(receive, self.max_bytes)
        if read is None:
            return  # the client went away before its body was complete: nobody to answer
        raw, more = read
        headers = _headers(scope)
        body = None if more else _well_formed(raw, headers, self.max_bytes)
        if body is None:
            await self.app(scope, _replay(raw, more, receive), with_request_id(send, from_scope(scope)))
            return
        if isinstance(body, Response):  # refused as FastAPI would refuse it
            await body(scope, _replay(raw, more, receive), with_request_id(send, from_scope(scope)))
            return
        gw = gateway_of(self.state or scope["app"].state)
        route = scope["path"]
        started = time.perf_counter()
        status = 500
        try:
            with self.spans.span("POST", route, headers) as span:
                try:
                    response = await answer(gw, headers, body)
                except ServiceError as exc:  # not raised by the answers (`_guarded`); a safety net
                    headers_of = {**(exc.headers or {}), HEADER: from_scope(scope)}
                    response = error_response(exc.code, exc.detail, headers_of)
                except Exception as exc:  # nor this: without it the server's bare 500 has no id
                    response = unexpected_response(exc, from_scope(scope))
                status = response.status_code
                answered(span, status)
                await response(scope, receive, send)
        finally:  # the door's routes have no path parameters: the path is the route
            self.metrics.request_duration.labels(route, str(status)).observe(time.perf_counter() - started)

    def _declared_too_large(self, scope: Scope) -> bool:
        if self.max_bytes is None:
            return False
        for name, value in scope.get("headers", ()):
            if name.lower() == b"content-length":
                return value.isdigit() and int(value) > self.max_bytes
        return False


async def _read_body(receive: Receive, max_bytes: int | None) -> tuple[bytes, bool] | None:
    """The body and whether more of it is still to come: reading stops once it passes
    `max_bytes` (the framework's body limit then refuses it); None when the client left."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunk: bytes = message.get("body", b"")
        chunks.append(chunk)
        size += len(chunk)
        more = bool(message.get("more_body", False))
        if not more or (max_bytes is not None and size > max_bytes):
            return b"".join(chunks), more


def _replay(raw: bytes, more: bool, receive: Receive) -> Receive:
    """What was read, as one message, then the rest as the server sends it."""
    pending: Message | None = {"type": "http.request", "body": raw, "more_body": more}

    async def replay() -> Message:
        nonlocal pending
        if pending is None:
            return await receive()
        message, pending = pending, None
        return message

    return replay


# ---------------------------------------------------------------------- FastAPI routes
def _request_headers(request: Request) -> dict[str, str]:
    return _headers(request.scope)


_TRACE = {"parameters": api.TRACE_HEADERS}


def _secured(security: list[dict[str, list[str]]]) -> dict[str, object]:
    return {**_TRACE, "security": security}


def query_router() -> APIRouter:
    """The same routes for what `QueryRoutes` passes on; the header parameters are declared so
    that FastAPI validates and documents them as before. Their OpenAPI (`query_gateway.openapi`)
    describes the routes as both doors serve them."""
    router = APIRouter(tags=["query"])

    @router.post(
        "/query",
        summary="Query the datasets (normal or legacy EDR path)",
        description=api.QUERY_DESCRIPTION,
        responses=api.QUERY_RESPONSES,
        openapi_extra=_secured(api.QUERY_SECURITY),
    )
    async def query(
        request: Request,
        body: QueryBody,
        *,
        authorization: AuthorizationHeader = None,
        edc_contract_agreement_id: AgreementHeader = None,
        edc_transfer_process_id: TransferHeader = None,
        edc_purpose: PurposeHeader = None,
    ) -> Response:
        return await answer_query(gateway_of(request.app.state), _request_headers(request), body)

    @router.post(
        "/query/plan",
        summary="The narrowed statement of a normal-path query, not executed",
        description=api.PLAN_DESCRIPTION,
        responses=api.PLAN_RESPONSES,
        openapi_extra=_secured(api.PLAN_SECURITY),
    )
    async def query_plan(
        request: Request, body: QueryBody, authorization: AuthorizationHeader = None
    ) -> Response:
        return await answer_plan(gateway_of(request.app.state), _request_headers(request), body)

    return router


def dps_router() -> APIRouter:
    router = APIRouter(tags=["dps"])

    @router.post(
        "/dps/public/query",
        summary="Query over a DPS pull token",
        description=api.PULL_DESCRIPTION,
        responses=api.PULL_RESPONSES,
        openapi_extra=_secured(api.PULL_SECURITY),
    )
    async def pull_query(
        request: Request,
        body: QueryBody,
        *,
        authorization: PullAuthorizationHeader = None,
        edc_contract_agreement_id: AgreementHeader = None,
        edc_transfer_process_id: TransferHeader = None,
        edc_purpose: PurposeHeader = None,
    ) -> Response:
        if has_filter(request.scope.get("query_string", b"")):
            # a client range filter belongs to the records route only (docs/records.md)
            raise RequestRefused("client filters are taken by the records route only")
        return await answer_pull(gateway_of(request.app.state), _request_headers(request), body)

    return router
