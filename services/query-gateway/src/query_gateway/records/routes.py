"""The records API's routes (FastAPI, mounted with DPS_ENABLED): stream metadata, records pages,
and the protected-resource metadata that advertises the client range-filter profile."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import APIRouter, FastAPI, Path, Request
from fastapi.responses import JSONResponse, Response

from dataplane_contracts.records import PROFILE_URI
from dataplane_service_kit.errors import ServiceError, problem_response
from dataplane_service_kit.request_ids import incoming_of
from query_gateway import openapi as api
from query_gateway.access_log import AccessContext
from query_gateway.deps import (
    AgreementHeader,
    PullAuthorizationHeader,
    PurposeHeader,
    TransferHeader,
    guarded,
)
from query_gateway.deps import context as access_context
from query_gateway.records.changes import Pending
from query_gateway.records.cursor import CursorCodec
from query_gateway.records.long_poll import polled
from query_gateway.records.read import Headers
from query_gateway.records.request import RequestRefused
from query_gateway.records.serve import records_page, stream_metadata
from query_gateway.records.watch import ChangeWatchers
from query_gateway.state import Gateway, gateway_of

STREAM = "/dps/public/streams/{dataset}"
RECORDS = STREAM + "/records"
PROTECTED_RESOURCE = "/.well-known/oauth-protected-resource"
DatasetPath = Annotated[str, Path(min_length=1, max_length=255, description="the flow's dataset id")]


def capabilities() -> dict[str, object]:
    return {"client_range_filters": {"supported": True, "stability": "experimental", "profile": PROFILE_URI}}


def _headers(request: Request, *, transfer: bool) -> Headers:
    """The route's headers from what the front door read (the parameters below only document
    them); the stream route takes no transfer or purpose."""
    h = incoming_of(request.scope).headers
    agreement = (h.get("edc-contract-agreement-id") or "").strip() or None
    if not transfer:
        return Headers(h.get("authorization"), agreement, None, None)
    return Headers(h.get("authorization"), agreement, h.get("edc-transfer-process-id"), h.get("edc-purpose"))


Run = Callable[[Gateway, AccessContext], Awaitable[dict[str, object]]]


async def _answer(request: Request, route: str, run: Run) -> Response:
    """One request under the gateway's access records and metrics, as the query routes are."""
    ctx = access_context(incoming_of(request.scope), "GET", route)
    gw = gateway_of(request.app.state)

    async def once() -> dict[str, object]:
        return await run(gw, ctx)

    return await guarded(ctx, once, None)  # the records routes cap their own limit


def records_router() -> APIRouter:
    router = APIRouter(tags=["records"])

    @router.get(
        STREAM,
        summary="The stream's metadata: the flow's frozen client range filters",
        description=api.STREAM_DESCRIPTION,
        responses=api.STREAM_RESPONSES,
        openapi_extra={"security": api.PULL_SECURITY},
    )
    async def stream(
        request: Request,
        dataset: DatasetPath,
        *,
        authorization: PullAuthorizationHeader = None,
        edc_contract_agreement_id: AgreementHeader = None,
    ) -> Response:
        h = _headers(request, transfer=False)
        qs = request.scope.get("query_string", b"")

        async def run(gw: Gateway, ctx: AccessContext) -> dict[str, object]:
            return await stream_metadata(gw, h, dataset, qs, ctx)

        return await _answer(request, STREAM, run)

    @router.get(
        RECORDS,
        summary="A page of the flow's dataset, filtered by the flow's frozen client range filters",
        description=api.RECORDS_DESCRIPTION,
        responses=api.RECORDS_RESPONSES,
        openapi_extra={"parameters": api.RECORDS_QUERY, "security": api.PULL_SECURITY},
    )
    async def records(
        request: Request,
        dataset: DatasetPath,
        *,
        authorization: PullAuthorizationHeader = None,
        edc_contract_agreement_id: AgreementHeader = None,
        edc_transfer_process_id: TransferHeader = None,
        edc_purpose: PurposeHeader = None,
    ) -> Response:
        codec: CursorCodec | None = request.app.state.cursor_codec
        watchers: ChangeWatchers | None = request.app.state.change_watchers
        h = _headers(request, transfer=True)
        qs = request.scope.get("query_string", b"")

        async def run(_: Gateway, ctx: AccessContext) -> dict[str, object]:
            async def read(final: bool) -> dict[str, object] | Pending:
                # the gateway as it is at each read: after a catalogue reload, the new one
                now = gateway_of(request.app.state)
                return await records_page(
                    now, codec, h, dataset_id=dataset, query_string=qs, ctx=ctx, final=final
                )

            return await polled(watchers, read)

        return await _answer(request, RECORDS, run)

    @router.get(
        PROTECTED_RESOURCE,
        summary="Protected-resource metadata (RFC 9728) with the records API's capabilities",
        description=api.PROTECTED_RESOURCE_DESCRIPTION,
    )
    async def protected_resource(request: Request) -> dict[str, object]:
        resource = str(request.base_url).rstrip("/") + "/dps/public"
        return {"resource": resource, "capabilities": capabilities()}

    return router


def install_profile_errors(app: FastAPI) -> None:
    """`invalid_request` from the records routes (and a client filter sent to the pull query)
    with the profile's status, 400; every other refusal as the service kit renders it."""

    async def on_refused(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ServiceError)
        return problem_response(exc.code, exc.status_code, exc.detail, exc.headers)

    app.add_exception_handler(RequestRefused, on_refused)


__all__ = [
    "PROTECTED_RESOURCE",
    "RECORDS",
    "STREAM",
    "RequestRefused",
    "install_profile_errors",
    "records_router",
]
