"""What every query route reads and how each ends, shared by the query routes (`routes.py`) and
the records routes: the access record a request starts (from what the front door read of it),
the header parameters FastAPI documents, the caller's bearer verified, and `guarded` — the
outcome's access records, the answer or the refusal with the request's id."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Annotated, Any, TypeVar

import orjson
from fastapi import Header
from fastapi.responses import JSONResponse, Response
from opentelemetry import trace

from dataplane_service_kit.authorization import bearer
from dataplane_service_kit.errors import ServiceError, problem_response, unexpected_response
from dataplane_service_kit.request_ids import HEADER, Incoming
from query_gateway import openapi as api
from query_gateway.access_log import AccessContext
from query_gateway.clients.connector import resolve_connector
from query_gateway.clients.pull import VerifiedPull
from query_gateway.rules.caller import Caller
from query_gateway.rules.verdicts import DataspaceRequest, parse_purpose
from query_gateway.state import Gateway

# on a page whose `limit` is not the one asked for (QE-01: <= 0 means 100, above 10 000 means
# 10 000): the limit the request asked for (docs/gateway.md)
LIMIT_CLAMPED = "X-Limit-Clamped"
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$")

T = TypeVar("T")
Headers = Mapping[str, str]  # lower-case names, the first value of each (as FastAPI's Header())


def context(incoming: Incoming, method: str, route: str) -> AccessContext:
    """A request's access context: the id the front door gave it, the trace of its span."""
    return AccessContext(
        request_id=incoming.request_id,
        trace_id=_trace_id(incoming.headers),
        method=method,
        route=route,
    )


def _trace_id(headers: Headers) -> str | None:
    """The trace of the request's server span — the caller's when it sent a `traceparent`, else
    the one the span began; the caller's header alone when tracing is off."""
    context = trace.get_current_span().get_span_context()
    if context.is_valid:
        return format(context.trace_id, "032x")
    match = _TRACEPARENT.fullmatch(headers.get("traceparent", "").strip().lower())
    return match.group(1) if match else None


async def guarded(
    ctx: AccessContext,
    run: Callable[[], Awaitable[dict[str, object]]],
    asked_limit: int | None,
) -> Response:
    """Runs one request: the access records of its outcome, the answer or the refusal with the
    request's id; a fault of ours answered 500 internal_error, recorded alike. The front door
    counts every answer (`query_gateway_requests_total`) from what is answered here."""
    try:
        body = await run()
    except ServiceError as exc:
        ctx.failed(exc.code, exc.status_code)
        # the error's own status: a code's fixed one, or the records profile's 400 (RequestRefused)
        headers = {**(exc.headers or {}), HEADER: ctx.request_id}
        return problem_response(exc.code, exc.status_code, exc.detail, headers)
    except Exception as exc:  # a fault of ours: coded, counted and recorded like any refusal
        ctx.failed("internal_error", 500)
        return unexpected_response(exc, ctx.request_id)
    headers = {HEADER: ctx.request_id}
    applied = body.get("limit")
    if asked_limit is not None and applied is not None and applied != asked_limit:
        # QE-01 clamps the page size silently in the body's `limit`; the header says so
        headers[LIMIT_CLAMPED] = str(asked_limit)
    return json_response(body, headers)


def json_response(body: dict[str, object], headers: dict[str, str]) -> Response:
    """The answer encoded with orjson (a tenth of the standard encoder's cost on a page of rows;
    the values are already JSON's, `jsonable`). An integer beyond 64 bits, which orjson refuses,
    takes the standard encoder: same JSON, slower."""
    try:
        content = orjson.dumps(body)
    except orjson.JSONEncodeError:
        return JSONResponse(body, headers=headers)
    return Response(content, media_type="application/json", headers=headers)


async def token_check(ctx: AccessContext, check: Awaitable[T]) -> T:
    """GS-02: while a bearer is being verified, a refusal is recorded as `auth.token` (no caller,
    no dataset); once it verified, the request is a dataset read again."""
    ctx.checking_token(True)
    verified = await check
    ctx.checking_token(False)
    return verified


async def _verify_oidc(gw: Gateway, authorization: str) -> Caller:
    token = bearer(authorization)
    if token is None:
        if authorization.strip().partition(" ")[0].lower() != "bearer":
            # another scheme (Basic, say) is no bearer at all: RFC 6750, 3.1 answers a request
            # without one with a bare `Bearer` challenge, not `error="invalid_token"`
            raise ServiceError("auth_required", "this API takes a Bearer token, not another scheme")
        raise ServiceError("invalid_token", "bearer token is not valid")
    return await gw.oidc.verify(token)


async def caller_of(gw: Gateway, authorization: str | None, ctx: AccessContext) -> Caller | None:
    if authorization is None or not authorization.strip():
        return None
    caller = await token_check(ctx, _verify_oidc(gw, authorization))
    ctx.as_caller(caller.sub, caller.client_id, caller.service_account)
    return caller


def _header(description: str, *, listed: bool = True) -> Any:
    return Header(description=description, include_in_schema=listed)


# the bearer is documented as each route's `security` (query_gateway.openapi), not a parameter
AuthorizationHeader = Annotated[str | None, _header(api.AUTHORIZATION, listed=False)]
AgreementHeader = Annotated[str | None, _header(api.AGREEMENT)]
TransferHeader = Annotated[str | None, _header(api.TRANSFER)]
PurposeHeader = Annotated[str | None, _header(api.PURPOSE)]
PullAuthorizationHeader = Annotated[str | None, _header(api.PULL_AUTHORIZATION, listed=False)]


async def pull_grant(
    gw: Gateway,
    authorization: str | None,
    agreement: str | None,
    ctx: AccessContext,
    dataset_id: str | None = None,
) -> VerifiedPull:
    """DPS-09: the pull token verified against its flow; the access record names the consumer as
    soon as the token is known to be its. With `dataset_id` (the records routes), the flow must be
    for that dataset."""
    assert gw.pull is not None  # the pull routes are mounted only with DPS_ENABLED
    grant = await gw.pull.verify(authorization, agreement, ctx.as_consumer)
    if dataset_id is not None:
        if dataset_id != grant.dataset_id:
            # the same answer for a dataset that exists and one that does not
            raise ServiceError("not_offered", "the flow's pull token is not for this dataset")
        ctx.touching([dataset_id])
    return grant


def pull_request(
    gw: Gateway, grant: VerifiedPull, transfer: str | None, purpose: str | None
) -> DataspaceRequest:
    """A pull's dataspace request: the grant's consumer and agreement, its provider's connector."""
    return dataspace_request(
        consumer=grant.consumer,
        provider=grant.provider,
        connector_base=resolve_connector(gw.settings, grant.provider),
        agreement_id=grant.agreement_id,
        transfer=transfer,
        purpose=purpose,
    )


def dataspace_request(
    *,
    consumer: str,
    provider: str | None,
    connector_base: str,
    agreement_id: str,
    transfer: str | None,
    purpose: str | None,
) -> DataspaceRequest:
    """What a verified dataspace request says, from its EDC headers (`Edc-Transfer-Process-Id`,
    `Edc-Purpose`)."""
    return DataspaceRequest(
        consumer=consumer,
        provider=provider,
        connector_base=connector_base,
        agreement_id=agreement_id,
        transfer_id=transfer or None,
        purpose=parse_purpose(purpose),
    )
