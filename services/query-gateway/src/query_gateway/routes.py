"""HTTP routes: `POST /query` (normal path, or the legacy EDR path in dataspace mode),
`POST /query/plan` (normal path only) and `POST /dps/public/query` (DPS-09)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Awaitable, Callable
from typing import Annotated, TypeVar

import orjson
from fastapi import APIRouter, Header, Request
from fastapi.responses import JSONResponse, Response
from starlette.types import Scope

from dataplane_service_kit.errors import ServiceError
from dataplane_service_kit.logs import get_logger
from query_gateway.access_log import QUERY_ACTION, TOKEN_ACTION, AccessContext
from query_gateway.connector import resolve_connector
from query_gateway.dataspace import DataspaceRequest, parse_purpose, run_dataspace
from query_gateway.gateway import Gateway, QueryBody
from query_gateway.identity import Caller, bearer
from query_gateway.metrics import REQUESTS
from query_gateway.normal import explain_normal, run_normal

log = get_logger("query_gateway.routes")
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$")

OptHeader = Annotated[str | None, Header()]
T = TypeVar("T")


def _context(request: Request, route: str) -> AccessContext:
    request_id = request.headers.get("x-request-id") or request.headers.get("x-correlation-id")
    match = _TRACEPARENT.fullmatch(request.headers.get("traceparent", "").strip().lower())
    return AccessContext(
        request_id=(request_id or uuid.uuid4().hex)[:128],
        trace_id=match.group(1) if match else None,
        method=request.method,
        route=route,
    )


async def _guarded(
    route: str, ctx: AccessContext, run: Callable[[], Awaitable[dict[str, object]]]
) -> Response:
    """Runs one request: the access records and metrics of its outcome; errors re-raised."""
    try:
        body = await run()
    except ServiceError as exc:
        ctx.failed(exc.code, exc.status_code)
        REQUESTS.labels(route, str(exc.status_code), exc.code).inc()
        raise
    except Exception:
        ctx.failed("internal_error", 500)
        REQUESTS.labels(route, "500", "internal_error").inc()
        raise
    REQUESTS.labels(route, "200", "").inc()
    return json_response(body, {"X-Request-ID": ctx.request_id})


def json_response(body: dict[str, object], headers: dict[str, str]) -> Response:
    """The answer encoded with orjson (a tenth of the standard encoder's cost on a page of rows;
    the values are already JSON's, `jsonable`). An integer beyond 64 bits, which orjson refuses,
    takes the standard encoder: same JSON, slower."""
    try:
        content = orjson.dumps(body)
    except orjson.JSONEncodeError:
        return JSONResponse(body, headers=headers)
    return Response(content, media_type="application/json", headers=headers)


async def _token_check(ctx: AccessContext, check: Awaitable[T]) -> T:
    """GS-02: while a bearer is being verified, a refusal is recorded as `auth.token` (no caller,
    no dataset); once it verified, the request is a dataset read again."""
    ctx.action = TOKEN_ACTION
    verified = await check
    ctx.action = QUERY_ACTION
    return verified


async def _verify_oidc(gw: Gateway, authorization: str) -> Caller:
    token = bearer(authorization)
    if token is None:
        raise ServiceError("invalid_token", "bearer token is not valid")
    return await gw.oidc.verify(token)


async def _caller(gw: Gateway, authorization: str | None, ctx: AccessContext) -> Caller | None:
    if authorization is None or not authorization.strip():
        return None
    caller = await _token_check(ctx, _verify_oidc(gw, authorization))
    ctx.sub, ctx.client_id, ctx.service_account = caller.sub, caller.client_id, caller.service_account
    return caller


def body_refusals(dps_enabled: bool) -> Callable[[Scope], None]:
    """What a body over QUERY_MAX_BODY_BYTES leaves (refused by the service kit's `BodyLimit`
    before any route ran): the request's metric and its access record, as for any refusal."""
    routes = {"/query", "/query/plan"} | ({"/dps/public/query"} if dps_enabled else set())

    def refused(scope: Scope) -> None:
        route = scope.get("path", "")
        if route in routes:
            _context(Request(scope), route).failed("body_too_large", 413)
            REQUESTS.labels(route, "413", "body_too_large").inc()

    return refused


def query_router() -> APIRouter:
    router = APIRouter()

    @router.post("/query")
    async def query(
        request: Request,
        body: QueryBody,
        *,
        authorization: OptHeader = None,
        edc_contract_agreement_id: OptHeader = None,
        edc_transfer_process_id: OptHeader = None,
        edc_purpose: OptHeader = None,
    ) -> Response:
        gw: Gateway = request.app.state.gateway
        ctx = _context(request, "/query")
        agreement = (edc_contract_agreement_id or "").strip()
        if gw.settings.edr_enabled and agreement:
            # dataspace mode: the bearer is an EDR token and never reaches the OIDC issuer

            async def edr() -> dict[str, object]:
                identity = await _token_check(
                    ctx, gw.connector.verify_edr(bearer(authorization) if authorization else None)
                )
                req = DataspaceRequest(
                    consumer=identity.consumer,
                    provider=identity.provider,
                    connector_base=identity.base_url,
                    agreement_id=agreement,
                    transfer_id=edc_transfer_process_id or None,
                    purpose=parse_purpose(edc_purpose),
                )
                return await run_dataspace(gw, body, req, ctx)

            return await _guarded("/query", ctx, edr)

        async def normal() -> dict[str, object]:
            return await run_normal(gw, body, await _caller(gw, authorization, ctx), ctx)

        return await _guarded("/query", ctx, normal)

    @router.post("/query/plan")
    async def query_plan(request: Request, body: QueryBody, authorization: OptHeader = None) -> Response:
        gw: Gateway = request.app.state.gateway
        ctx = _context(request, "/query/plan")

        async def explain() -> dict[str, object]:
            return await explain_normal(gw, body, await _caller(gw, authorization, ctx), ctx)

        return await _guarded("/query/plan", ctx, explain)

    return router


def dps_router() -> APIRouter:
    router = APIRouter()

    @router.post("/dps/public/query")
    async def pull_query(
        request: Request,
        body: QueryBody,
        *,
        authorization: OptHeader = None,
        edc_contract_agreement_id: OptHeader = None,
        edc_transfer_process_id: OptHeader = None,
        edc_purpose: OptHeader = None,
    ) -> Response:
        gw: Gateway = request.app.state.gateway
        ctx = _context(request, "/dps/public/query")

        async def pull() -> dict[str, object]:
            assert gw.pull is not None  # mounted only with DPS_ENABLED

            def identified(consumer: str, agreement_id: str) -> None:
                ctx.sub = ctx.client_id = consumer
                ctx.agreement_id = agreement_id

            grant = await gw.pull.verify(
                authorization, (edc_contract_agreement_id or "").strip() or None, identified
            )
            req = DataspaceRequest(
                consumer=grant.consumer,
                provider=grant.provider,
                connector_base=resolve_connector(gw.settings, grant.provider),
                agreement_id=grant.agreement_id,
                transfer_id=edc_transfer_process_id or None,
                purpose=parse_purpose(edc_purpose),
            )
            return await run_dataspace(gw, body, req, ctx)

        return await _guarded("/dps/public/query", ctx, pull)

    return router
