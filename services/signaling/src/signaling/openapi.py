"""What signaling's OpenAPI document says about each DPS route: its bearer, its answer and its
refusals with their codes. Declarations read once, when the document is built."""

from __future__ import annotations

from typing import Any

from fastapi import Response
from pydantic import BaseModel

from dataplane_service_kit.openapi import BEARER_CHALLENGE, REQUEST_ID, error_responses

SECURITY_SCHEMES = {
    "controlPlane": {
        "type": "http",
        "scheme": "bearer",
        "bearerFormat": "JWT",
        "description": "a client-credentials token of the configured OIDC issuer for this service's "
        "audience, whose `azp` (else `client_id`) is in `DPS_CONTROL_PLANE_CLIENTS` (DPS-02)",
    }
}

# every signal: authenticated first, whatever the body (SignallingRoute); the flows database
_SIGNAL = ("no_token", "invalid_token", "client_not_admitted")
_STORED = (*_SIGNAL, "database_unavailable")
# a path segment holding `/` matches no route: the framework's 404; one holding a NUL cannot be
# looked up: 422 invalid_message
_BY_ID = (*_STORED, "not_found", "invalid_message")


def signal(
    summary: str,
    *codes: str,
    ok: type[BaseModel] | None = None,
    ok_status: int = 200,
    ok_description: str = "done",
    description: str | None = None,
    accepted: bool = False,
) -> dict[str, Any]:
    """The route decorator's documentation arguments of one signal; `accepted`: it may answer
    202 (DPS_ASYNC_SIGNALS) with the same body and a Location."""
    answer: dict[str, Any] = {"description": ok_description, "headers": REQUEST_ID}
    pending: dict[int, Any] = {}
    if accepted and ok is not None:
        pending[202] = {
            "description": "accepted (DPS_ASYNC_SIGNALS): PREPARING / STARTING; the DPS-12 callback "
            "`prepared` / `started` follows",
            "model": ok,
            "headers": {
                "Location": {
                    "description": "the flow's status: /dps/v1/dataflows/{id}/status",
                    "schema": {"type": "string"},
                }
            },
        }
    kwargs: dict[str, Any] = {}
    if ok is not None:
        answer["model"] = ok
    else:  # an empty answer: no content type is documented (the route returns its Response)
        kwargs["response_class"] = Response
    return {
        **kwargs,
        "summary": summary,
        "description": description,
        "status_code": ok_status,
        "responses": {
            ok_status: answer,
            **pending,
            **error_responses(*codes, headers={401: BEARER_CHALLENGE}),
        },
        "openapi_extra": {"security": [{"controlPlane": []}]},
    }


# the schema shows one spelling of each; the tolerant reader takes both (DPS-03)
SPELLINGS = (
    "A tolerant reader (DPS-03): unknown fields are ignored; the flow id is read from `dataFlowId` "
    "or `processId`, the transfer type from `transferType` (RC2) or `profile` (RC3+)."
)

ASYNCHRONOUS = (
    " With `DPS_ASYNC_SIGNALS=true` the answer is 202 with PREPARING / STARTING (a start without "
    "its data address) and a `Location` of the flow's status; the transition is finished in the "
    "background and announced by the DPS-12 callback (`prepared` / `started`, the latter with the "
    "data address) to the `callbackAddress`, else the caller's registered endpoint; with neither, "
    "400 `callback_address_required`."
)

REGISTRATION = _SIGNAL
CONTROL_PLANE_PUT = (*_STORED, "invalid_message", "control_plane_taken")
CONTROL_PLANE_DELETE = (*_BY_ID, "control_plane_not_found")
PREPARE = (
    *_STORED,
    "invalid_message",
    "unsupported_transfer_type",
    "flow_exists",
    "callback_address_required",
)
# not_ready: a start asking for range filters while the catalogue cannot be read (docs/records.md)
START = (*PREPARE, "data_address_not_allowed", "not_ready")
START_DESCRIPTION = (
    SPELLINGS + " `metadata.pdpp_range_filters: true` freezes the dataset's client range filters, as "
    "the catalogue declares them now, for the life of the flow; any value but a boolean is "
    "`invalid_message`, and so is `true` on a data plane offering none."
)
STARTED = (*_BY_ID, "invalid_message", "flow_not_found", "invalid_transition", "data_address_required")
TRANSITION = (*_BY_ID, "invalid_message", "flow_not_found", "invalid_transition")
COMPLETED = (*_BY_ID, "flow_not_found", "invalid_transition")
STATUS = (*_BY_ID, "flow_not_found")

# the consumer's renewal of an http-pull token: a form, authenticated by the client's own JWT
TOKEN = (
    "unsupported_grant_type",
    "invalid_refresh_request",
    "refresh_token_invalid",
    "client_auth_required",
    "client_jwt_invalid",
    "client_did_unresolvable",
    "client_not_counter_party",
    "client_audience",
    "client_jwt_replayed",
    "database_unavailable",
)


class RenewedTokensBody(BaseModel):
    """RFC 6749 section 5.1's answer: a new access token and a new refresh token."""

    access_token: str
    token_type: str
    expires_in: int
    refresh_token: str


def token_route() -> dict[str, Any]:
    """The renewal route's documentation arguments (docs/dps.md, the http-pull profile)."""
    form = {
        "type": "object",
        "required": ["grant_type", "refresh_token"],
        "properties": {
            "grant_type": {"type": "string", "enum": ["refresh_token"]},
            "refresh_token": {"type": "string"},
        },
    }
    return {
        "summary": "Renew an http-pull access token (refresh_token grant)",
        "description": "Authenticated by `Authorization: Bearer <client JWT>`: signed by the consumer's "
        "did:web key, iss = sub = its DID, aud = the provider, a `token` claim holding the current "
        "access token. Answered with `Cache-Control: no-store`.",
        "response_model": RenewedTokensBody,
        "responses": {
            200: {"description": "a new token pair", "headers": REQUEST_ID},
            **error_responses(*TOKEN, headers={401: BEARER_CHALLENGE}),
        },
        "openapi_extra": {
            "requestBody": {
                "required": True,
                "content": {"application/x-www-form-urlencoded": {"schema": form}},
            }
        },
    }
