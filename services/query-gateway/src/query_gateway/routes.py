"""HTTP routes: `POST /query` (normal path, or the legacy EDR path in dataspace mode),
`POST /query/plan` (normal path only) and `POST /dps/public/query` (DPS-09).

Each route is one `answer_*` function over what the front door read of the request (`Incoming`:
its headers and id) and its body. Every request passes the service kit's front door first (request
id, body bound, span, metrics, the last safety net); behind it, two callers of the same functions:
`QueryRoutes`, the fast path, which serves a well-formed body without FastAPI's router, dependency
resolution and request objects; and the FastAPI routes, which see only what `QueryRoutes` passes
on — a body that is not a JSON object of the expected fields, another content type — so every
refusal of a malformed request keeps the framework's rendering exactly."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from dataplane_service_kit.authorization import bearer
from dataplane_service_kit.errors import error_response, validation_detail
from dataplane_service_kit.front_door import ROUTE_KEY
from dataplane_service_kit.limits import replayed
from dataplane_service_kit.request_ids import Incoming, incoming_of
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
from query_gateway.pipeline import QueryBody, explain_normal, run_dataspace, run_normal
from query_gateway.records.frozen import frozen_of
from query_gateway.records.request import RequestRefused, has_filter
from query_gateway.state import Gateway, gateway_of

Answer = Callable[[Gateway, Incoming, QueryBody], Awaitable[Response]]


# ---------------------------------------------------------------------- the routes, once
async def answer_query(gw: Gateway, incoming: Incoming, body: QueryBody) -> Response:
    ctx = context(incoming, "POST", "/query")
    headers = incoming.headers
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

        return await guarded(ctx, edr, body.limit)

    async def normal() -> dict[str, object]:
        return await run_normal(gw, body, await caller_of(gw, authorization, ctx), ctx)

    return await guarded(ctx, normal, body.limit)


async def answer_plan(gw: Gateway, incoming: Incoming, body: QueryBody) -> Response:
    ctx = context(incoming, "POST", "/query/plan")
    headers = incoming.headers

    async def explain() -> dict[str, object]:
        return await explain_normal(gw, body, await caller_of(gw, headers.get("authorization"), ctx), ctx)

    return await guarded(ctx, explain, None)


async def answer_pull(gw: Gateway, incoming: Incoming, body: QueryBody) -> Response:
    ctx = context(incoming, "POST", "/dps/public/query")
    headers = incoming.headers

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

    return await guarded(ctx, pull, body.limit)


def _routes(dps_enabled: bool) -> dict[str, Answer]:
    routes: dict[str, Answer] = {"/query": answer_query, "/query/plan": answer_plan}
    if dps_enabled:  # DPS-01: the pull route exists only on a DPS data plane
        routes["/dps/public/query"] = answer_pull
    return routes


def body_refusals(dps_enabled: bool) -> Callable[[Scope], None]:
    """The access record of a body over QUERY_MAX_BODY_BYTES on a query route (refused by the
    front door before any route ran; the door counts it), as for any refusal."""
    routes = set(_routes(dps_enabled))

    def refused(scope: Scope) -> None:
        route = scope.get("path", "")
        if route in routes:
            context(incoming_of(scope), scope.get("method", "POST"), route).failed("body_too_large", 413)

    return refused


# ---------------------------------------------------------------------- the fast path
def _json_media(content_type: str | None) -> bool:
    """No content type, or exactly JSON's: the two cases in which FastAPI decodes a JSON body.
    Any other (a `+json` subtype among them) is left to FastAPI and decided there."""
    if content_type is None:
        return True
    return content_type.partition(";")[0].strip().lower() == "application/json"


_FIELDS = tuple(QueryBody.model_fields)


def _well_formed(raw: bytes, headers: Headers) -> QueryBody | Response | None:
    """The body as FastAPI would bind it; the refusal of a JSON object whose only fault is a field
    the body does not take (FastAPI's words: `validation_detail`); None for anything else FastAPI
    would refuse or decide differently (not JSON, an empty body, a JSON value orjson reads
    otherwise, a field error)."""
    if not raw or not _json_media(headers.get("content-type")):
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
    """The query routes' fast path, the innermost middleware of the gateway (behind the front
    door, which has read the body whole within its bound): a well-formed POST to a query route is
    answered here — no framework routing, dependency resolution or request objects; everything
    else — other routes and methods, a body FastAPI must refuse in its own words — goes on to
    `app` with the body replayed."""

    def __init__(self, app: ASGIApp, dps_enabled: bool, state: Any) -> None:
        self.app = app
        self.routes = _routes(dps_enabled)
        self.state = state  # where `gateway` is set by the lifespan (the FastAPI app's state)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        answer = self.routes.get(scope["path"]) if scope["type"] == "http" else None
        if (
            answer is None
            or scope["method"] != "POST"
            # a client filter on the pull query is refused by the framework's route
            or (scope["path"] == "/dps/public/query" and has_filter(scope.get("query_string", b"")))
        ):
            await self.app(scope, receive, send)
            return
        message = await receive()
        if message["type"] != "http.request":
            return  # the client went away: nobody to answer
        raw: bytes = message.get("body", b"")
        incoming = incoming_of(scope)
        body = None if message.get("more_body", False) else _well_formed(raw, incoming.headers)
        if body is None:
            await self.app(scope, replayed(message, receive), send)
            return
        scope[ROUTE_KEY] = scope["path"]  # the door's metrics and span: these routes are their paths
        if isinstance(body, Response):  # refused as FastAPI would refuse it
            await body(scope, receive, send)
            return
        response = await answer(gateway_of(self.state), incoming, body)
        await response(scope, receive, send)


# ---------------------------------------------------------------------- FastAPI routes
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
        return await answer_query(gateway_of(request.app.state), incoming_of(request.scope), body)

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
        return await answer_plan(gateway_of(request.app.state), incoming_of(request.scope), body)

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
        return await answer_pull(gateway_of(request.app.state), incoming_of(request.scope), body)

    return router
