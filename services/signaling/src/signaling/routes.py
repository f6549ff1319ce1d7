"""The DPS signalling routes (DPS-02 … DPS-11), mounted only when DPS_ENABLED (DPS-01).

Every route authenticates first (SignallingRoute), then handlers parse, authorise and delegate to
FlowService; refusals are ServiceErrors rendered (and audited) once by the handlers installed in
app.py. The handlers are module-level functions on two module-level routers (`dps_router`,
`token_router`) that an app includes; what a handler needs of the lifespan's state it declares as
a dependency (`AppStateDep`, `DpsDep`, `MetricsDep`, `Caller`), read from `app.state.signaling`
through the one typed accessor of signaling.state."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Annotated, Any
from urllib.parse import parse_qs, quote

from fastapi import APIRouter, Body, Depends, Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

from dataplane_contracts.dps import (
    REFRESH_PATH,
    SIGNALING_PATH,
    ControlPlaneRegistrationMessage,
    DataFlowPrepareMessage,
    DataFlowResumeMessage,
    DataFlowStartedMessage,
    DataFlowStartMessage,
    DataFlowStatusMessage,
    DataFlowStatusResponse,
    DataFlowSuspendMessage,
    DataFlowTerminateMessage,
    DataPlaneRegistrationMessage,
    FlowState,
)
from dataplane_service_kit.authorization import bearer
from dataplane_service_kit.errors import ServiceError
from signaling import openapi as api
from signaling import repository
from signaling.metrics import Metrics
from signaling.oidc import InvalidToken
from signaling.state import AppState, Dps, app_state, dps_state


async def authenticate(request: Request) -> str:
    """DPS-02: a valid bearer from the configured issuer, whose azp (else client_id) is admitted."""
    dps = dps_state(request)
    token = bearer(request.headers.get("authorization"))
    if token is None:
        raise ServiceError("no_token", "signalling requires a bearer token")
    try:
        claims = await dps.verifier.verify(token)
    except InvalidToken:
        raise ServiceError("invalid_token", "signalling token is not valid") from None
    client = claims.get("azp") or claims.get("client_id")
    if isinstance(client, str):
        request.state.caller = client  # named in the access record from here on
    if not isinstance(client, str) or client not in dps.admitted:
        raise ServiceError("client_not_admitted", "this client may not signal this data plane")
    return client


class SignallingRoute(APIRoute):
    """A /dps route that authenticates before anything else.

    FastAPI reads and parses the JSON body before it solves any dependency, so an auth dependency
    would let an unauthenticated caller with a malformed body learn `invalid_message` (422) instead
    of `no_token` (401). Wrapping the route handler puts DPS-02 ahead of the body, whatever it is;
    the refusal is raised inside the route, so the audited error handlers of app.py render it."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def authenticated(request: Request) -> Response:
            request.state.admitted_caller = await authenticate(request)
            return await handler(request)

        return authenticated


def signalling_caller(request: Request) -> str:
    """The caller SignallingRoute admitted (every route using this dependency is one)."""
    caller: str = request.state.admitted_caller
    return caller


def app_metrics(request: Request) -> Metrics:
    """This app's registry (the one its /metrics serves)."""
    return app_state(request).metrics


Caller = Annotated[str, Depends(signalling_caller)]
AppStateDep = Annotated[AppState, Depends(app_state)]
DpsDep = Annotated[Dps, Depends(dps_state)]
MetricsDep = Annotated[Metrics, Depends(app_metrics)]


def _ok(metrics: Metrics, signal: str) -> None:
    metrics.signals.labels(signal=signal, outcome="ok").inc()


_PENDING = frozenset({FlowState.PREPARING, FlowState.STARTING})


def _status(msg: DataFlowStatusMessage) -> JSONResponse:
    """200 with the flow's state; an asynchronous signal's PREPARING/STARTING is 202 with the
    flow's status as its Location (the DPS-12 callback says the rest)."""
    if msg.state in _PENDING:
        location = f"{SIGNALING_PATH}/{quote(msg.data_flow_id, safe='')}/status"
        return JSONResponse(msg.wire(), status_code=202, headers={"Location": location})
    return JSONResponse(msg.wire())


# `/dps`: this data plane's registration, the control planes and the flows, each route behind
# SignallingRoute (DPS-02 before anything else); mounted only when DPS_ENABLED (app.py)
dps_router = APIRouter(prefix="/dps", route_class=SignallingRoute, tags=["dps"])
_flows = APIRouter(prefix=SIGNALING_PATH.removeprefix("/dps"), route_class=SignallingRoute)


@dps_router.get(
    "/registration",
    **api.signal(
        "This data plane's registration (DPS-10)", *api.REGISTRATION, ok=DataPlaneRegistrationMessage
    ),
)
async def registration(state: AppStateDep, _: Caller, metrics: MetricsDep) -> JSONResponse:
    """DPS-10: EDC's data-plane registration body, without the authorization profile."""
    settings = state.settings
    msg = DataPlaneRegistrationMessage(
        dataplaneId=settings.dps_dataplane_id,
        endpoint=settings.dps_signaling_url.rstrip("/") + SIGNALING_PATH,
        transferTypes=list(settings.dps_transfer_types),
        labels=list(settings.dps_labels),
    )
    _ok(metrics, "registration")
    return JSONResponse(msg.model_dump(mode="json", by_alias=True))


@dps_router.put(
    "/v1/controlplanes",
    **api.signal("Register or replace a control plane (DPS-11)", *api.CONTROL_PLANE_PUT),
)
async def register_control_plane(
    msg: ControlPlaneRegistrationMessage, caller: Caller, state: AppStateDep, metrics: MetricsDep
) -> Response:
    """DPS-11: register or replace; the authorization profile is accepted and dropped."""
    async with state.engine.begin() as conn:
        ok = await repository.register_control_plane(conn, msg.controlplane_id, msg.endpoint, caller)
    if not ok:
        raise ServiceError("control_plane_taken", "this control plane id is registered by another client")
    _ok(metrics, "controlplanes")
    return Response(status_code=200)


@dps_router.delete(
    "/v1/controlplanes/{controlplane_id}",
    **api.signal("Remove a control plane registration (DPS-11)", *api.CONTROL_PLANE_DELETE, ok_status=204),
)
async def delete_control_plane(
    controlplane_id: str, caller: Caller, state: AppStateDep, metrics: MetricsDep
) -> Response:
    async with state.engine.begin() as conn:
        ok = await repository.delete_control_plane(conn, controlplane_id, caller)
    if not ok:
        raise ServiceError("control_plane_not_found", "no such control plane registration")
    _ok(metrics, "controlplanes")
    return Response(status_code=204)


@_flows.post(
    "/prepare",
    **api.signal(
        "Prepare a consumer-side flow (DPS-04)",
        *api.PREPARE,
        ok=DataFlowStatusMessage,
        description=api.SPELLINGS + api.ASYNCHRONOUS,
        accepted=True,
    ),
)
async def prepare(
    msg: DataFlowPrepareMessage, caller: Caller, dps: DpsDep, metrics: MetricsDep
) -> JSONResponse:
    answer = await dps.flows.prepare(msg, caller)
    _ok(metrics, "prepare")
    return _status(answer)


@_flows.post(
    "/start",
    **api.signal(
        "Start a provider-side pull flow: the pull address and its token (DPS-05, DPS-06)",
        *api.START,
        ok=DataFlowStatusMessage,
        description=api.START_DESCRIPTION + api.ASYNCHRONOUS,
        accepted=True,
    ),
)
async def start(msg: DataFlowStartMessage, caller: Caller, dps: DpsDep, metrics: MetricsDep) -> JSONResponse:
    answer = await dps.flows.start(msg, caller)
    _ok(metrics, "start")
    return _status(answer)


@_flows.post(
    "/{flow_id}/started", **api.signal("The provider started a consumer-side flow (DPS-07)", *api.STARTED)
)
async def started(
    flow_id: str,
    caller: Caller,
    dps: DpsDep,
    metrics: MetricsDep,
    msg: Annotated[DataFlowStartedMessage | None, Body()] = None,
) -> Response:
    await dps.flows.started(flow_id, None if msg is None else msg.data_address, caller)
    _ok(metrics, "started")
    return Response(status_code=200)


@_flows.post("/{flow_id}/suspend", **api.signal("Suspend a flow; its token dies (DPS-07)", *api.TRANSITION))
async def suspend(
    flow_id: str,
    caller: Caller,
    dps: DpsDep,
    metrics: MetricsDep,
    msg: Annotated[DataFlowSuspendMessage | None, Body()] = None,
) -> Response:
    await dps.flows.suspend(flow_id, caller)
    _ok(metrics, "suspend")
    return Response(status_code=200)


@_flows.post(
    "/{flow_id}/resume",
    **api.signal(
        "Resume a suspended flow; a provider flow gets a new token (DPS-07)",
        *api.TRANSITION,
        ok=DataFlowStatusMessage,
    ),
)
async def resume(
    flow_id: str,
    caller: Caller,
    dps: DpsDep,
    metrics: MetricsDep,
    msg: Annotated[DataFlowResumeMessage | None, Body()] = None,
) -> JSONResponse:
    answer = await dps.flows.resume(flow_id, None if msg is None else msg.data_address, caller)
    _ok(metrics, "resume")
    return _status(answer)


@_flows.post(
    "/{flow_id}/terminate",
    **api.signal("Terminate a flow; idempotent, its token dies (DPS-07)", *api.TRANSITION),
)
async def terminate(
    flow_id: str,
    caller: Caller,
    dps: DpsDep,
    metrics: MetricsDep,
    msg: Annotated[DataFlowTerminateMessage | None, Body()] = None,
) -> Response:
    await dps.flows.terminate(flow_id, caller)
    _ok(metrics, "terminate")
    return Response(status_code=200)


@_flows.post("/{flow_id}/completed", **api.signal("Complete a flow; its token dies (DPS-07)", *api.COMPLETED))
async def completed(flow_id: str, caller: Caller, dps: DpsDep, metrics: MetricsDep) -> Response:
    """The body (normally `{}`) is ignored."""
    await dps.flows.completed(flow_id, caller)
    _ok(metrics, "completed")
    return Response(status_code=200)


@_flows.get(
    "/{flow_id}/status", **api.signal("A flow's state (DPS-08)", *api.STATUS, ok=DataFlowStatusResponse)
)
async def status(flow_id: str, caller: Caller, dps: DpsDep, metrics: MetricsDep) -> JSONResponse:
    answer = await dps.flows.status(flow_id, caller)
    _ok(metrics, "status")
    return JSONResponse(answer.model_dump(mode="json", by_alias=True))


dps_router.include_router(_flows)  # /dps/v1/dataflows/...


_FORM = "application/x-www-form-urlencoded"
MAX_FORM_BYTES = 16 * 1024

# the consumer's renewal of an http-pull token: authenticated by its client JWT (renewal.py), not
# by a control plane's token, so outside SignallingRoute
token_router = APIRouter()


@token_router.post(REFRESH_PATH, **api.token_route())
async def renew_token(request: Request, dps: DpsDep, metrics: MetricsDep) -> JSONResponse:
    """RFC 6749 section 6 (refresh_token grant) answered per its section 5.1, never cached."""
    if request.headers.get("content-type", "").split(";")[0].strip().lower() != _FORM:
        raise ServiceError("invalid_refresh_request", "the renewal must be an url-encoded form")
    raw = await request.body()
    if len(raw) > MAX_FORM_BYTES:
        raise ServiceError("invalid_refresh_request", "the renewal form is too large")
    try:
        form = parse_qs(raw.decode("ascii"), keep_blank_values=True, strict_parsing=bool(raw))
    except (UnicodeDecodeError, ValueError):
        raise ServiceError("invalid_refresh_request", "the renewal form cannot be read") from None

    def identified(did: str) -> None:
        request.state.caller = did  # named in the access record once its JWT verified

    renewed = await dps.renewal.renew(form, bearer(request.headers.get("authorization")), identified)
    _ok(metrics, "token")
    return JSONResponse(renewed.wire(), headers={"Cache-Control": "no-store", "Pragma": "no-cache"})
