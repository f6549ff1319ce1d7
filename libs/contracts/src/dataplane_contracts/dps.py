"""Data Plane Signaling (DPS-03 … DPS-13): wire messages, flow states, pull-token claims, the
pull-grant view and the flow event.

Incoming DPS messages are tolerant readers (unknown fields ignored, both spec spellings read);
what this data plane emits is built from the same models and serialised by alias."""

from __future__ import annotations

import uuid
from enum import StrEnum
from typing import Any, Literal, get_args

from pydantic import (
    AliasChoices,
    Field,
    StrictInt,
    StrictStr,
    ValidationInfo,
    computed_field,
    field_validator,
    model_validator,
)

from dataplane_contracts.base import ContractModel, Event, NonEmptyStr, TolerantModel

EDC_NAMESPACE = "https://w3id.org/edc/v0.0.1/ns/"
HTTP_ENDPOINT_TYPE = "https://w3id.org/idsa/v4.1/HTTP"
PULL_PATH = "/dps/public"
"""The data address endpoint is `{DPS_PUBLIC_URL}` + this; the client calls `{endpoint}/query`."""
SIGNALING_PATH = "/dps/v1/dataflows"
"""The registered signalling endpoint is `{DPS_SIGNALING_URL}` + this."""
HTTP_PULL_PROFILE = "https://w3id.org/dspace-sig/profile/http-pull"
"""The DPS http-pull profile: expiring access tokens with claims, renewable with a refresh token."""
HTTP_PULL_SHORT = "http-pull"
REFRESH_PATH = "/dps/token"
"""The http-pull profile's `refreshEndpoint` is `{DPS_REFRESH_URL}` + this (served by signaling)."""

# ---------------------------------------------------------------- flow states (docs/dps.md)


class FlowState(StrEnum):
    INITIALIZED = "INITIALIZED"
    PREPARING = "PREPARING"
    PREPARED = "PREPARED"
    STARTING = "STARTING"
    STARTED = "STARTED"
    SUSPENDED = "SUSPENDED"
    COMPLETED = "COMPLETED"
    TERMINATED = "TERMINATED"


class FlowRole(StrEnum):
    PROVIDER = "PROVIDER"  # created by start
    CONSUMER = "CONSUMER"  # created by prepare


_S = FlowState
ALLOWED_TRANSITIONS: dict[FlowState, frozenset[FlowState]] = {
    _S.INITIALIZED: frozenset({_S.PREPARING, _S.PREPARED, _S.STARTING, _S.STARTED, _S.TERMINATED}),
    _S.PREPARING: frozenset({_S.PREPARED, _S.TERMINATED}),
    _S.PREPARED: frozenset({_S.STARTING, _S.STARTED, _S.TERMINATED}),
    _S.STARTING: frozenset({_S.STARTED, _S.TERMINATED}),
    _S.STARTED: frozenset({_S.SUSPENDED, _S.COMPLETED, _S.TERMINATED}),
    _S.SUSPENDED: frozenset({_S.STARTED, _S.TERMINATED}),
    _S.COMPLETED: frozenset(),
    _S.TERMINATED: frozenset(),
}


def can_transition(current: FlowState, target: FlowState) -> bool:
    return target in ALLOWED_TRANSITIONS[current]


def is_pull_transfer(transfer_type: str) -> bool:
    """`HttpData-PULL`, `HttpData-PULL-Json`, `…/http-pull` are pull; anything else is not."""
    last = transfer_type.rstrip("/").rsplit("/", 1)[-1].replace("_", "-")
    return any(part.upper() == "PULL" for part in last.split("-"))


def canonical_transfer_type(transfer_type: str) -> str:
    """The http-pull profile under its URI whichever spelling names it; any other type as given."""
    return HTTP_PULL_PROFILE if transfer_type in (HTTP_PULL_SHORT, HTTP_PULL_PROFILE) else transfer_type


def is_http_pull_profile(transfer_type: str) -> bool:
    return canonical_transfer_type(transfer_type) == HTTP_PULL_PROFILE


# ---------------------------------------------------------------- data address (DSP 2025-1)

_CREDENTIAL_PROPERTIES = frozenset({"authorization", "refreshtoken"})


def _local_name(name: str) -> str:
    for sep in ("/", "#", ":"):
        name = name.rsplit(sep, 1)[-1]
    return name.lower()


class EndpointProperty(TolerantModel):
    type_: StrictStr = Field(default="EndpointProperty", alias="@type")
    name: StrictStr
    # a string in the DSP schema, but EDC/TCK addresses carry numbers (expiresIn). Left out of the
    # repr: the `authorization` property is the pull token itself (DPS-13)
    value: Any = Field(default=None, repr=False)


class DataAddress(TolerantModel):
    type_: StrictStr = Field(default="DataAddress", alias="@type")
    endpoint_type: StrictStr | None = Field(default=None, alias="endpointType")
    endpoint: StrictStr | None = None
    endpoint_properties: list[EndpointProperty] = Field(default_factory=list, alias="endpointProperties")

    @field_validator("endpoint_properties", mode="before")
    @classmethod
    def _null_is_empty(cls, v: object) -> object:
        return [] if v is None else v

    def property(self, name: str) -> str | None:
        """A property by its full name, or by its local name when no full name matches."""
        for p in self.endpoint_properties:
            if p.name == name:
                return None if p.value is None else str(p.value)
        local = _local_name(name)
        for p in self.endpoint_properties:
            if _local_name(p.name) == local:
                return None if p.value is None else str(p.value)
        return None

    def without_credentials(self) -> DataAddress:
        """The address as it may be stored: every credential property removed (DPS-13)."""
        kept = [p for p in self.endpoint_properties if _local_name(p.name) not in _CREDENTIAL_PROPERTIES]
        return self.model_copy(update={"endpoint_properties": kept})

    def wire(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


def pull_data_address(public_url: str, token: str) -> DataAddress:
    """The DPS-05 pull address: EDC-namespaced properties, bearer auth, endpoint `{public}/dps/public`."""
    endpoint = public_url.rstrip("/") + PULL_PATH
    props = {
        "endpoint": endpoint,
        "endpointType": HTTP_ENDPOINT_TYPE,
        "authorization": token,
        "authType": "bearer",
    }
    return DataAddress.model_validate(
        {
            "endpointType": HTTP_ENDPOINT_TYPE,
            "endpoint": endpoint,
            "endpointProperties": [{"name": EDC_NAMESPACE + k, "value": v} for k, v in props.items()],
        }
    )


def http_pull_data_address(
    public_url: str, access_token: str, refresh_token: str, expires_in: int, refresh_endpoint: str
) -> DataAddress:
    """The http-pull profile's address: plain property names, bearer auth, the renewal properties
    (`expiresIn` in seconds, digits only). The endpoint is the address's own `endpoint` only: the
    profile has no `endpoint` property (issue 33), unlike the EDC-namespaced address of DPS-05,
    whose properties repeat it by that clause."""
    endpoint = public_url.rstrip("/") + PULL_PATH
    props = {
        "authType": "bearer",
        "authorization": access_token,
        "refreshToken": refresh_token,
        "expiresIn": str(int(expires_in)),
        "refreshEndpoint": refresh_endpoint,
    }
    return DataAddress.model_validate(
        {
            "endpointType": HTTP_PULL_PROFILE,
            "endpoint": endpoint,
            "endpointProperties": [{"name": k, "value": v} for k, v in props.items()],
        }
    )


# ---------------------------------------------------------------- messages (DPS-03)


class DataFlowMessage(TolerantModel):
    """Prepare and start share these fields. Flow id from `dataFlowId` or `processId`, transfer
    type from `transferType` (RC2) or `profile` (RC3+); the deciding facts are required."""

    message_id: StrictStr | None = Field(default=None, alias="messageId")
    flow_id: NonEmptyStr = Field(validation_alias=AliasChoices("dataFlowId", "processId"))
    participant_id: NonEmptyStr = Field(alias="participantId")
    counter_party_id: NonEmptyStr = Field(alias="counterPartyId")
    agreement_id: NonEmptyStr = Field(alias="agreementId")
    dataset_id: NonEmptyStr = Field(alias="datasetId")
    transfer_type: NonEmptyStr = Field(validation_alias=AliasChoices("transferType", "profile"))
    dataspace_context: StrictStr | None = Field(default=None, alias="dataspaceContext")
    callback_address: StrictStr | None = Field(default=None, alias="callbackAddress")
    # the control plane's claims about the counter-party may carry credentials: not in the repr
    claims: dict[str, Any] = Field(default_factory=dict, repr=False)
    labels: list[StrictStr] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("claims", "metadata", "labels", mode="before")
    @classmethod
    def _null_is_empty(cls, v: object, info: ValidationInfo) -> object:
        if v is None:
            return [] if info.field_name == "labels" else {}
        return v


class DataFlowPrepareMessage(DataFlowMessage):
    pass


class DataFlowStartMessage(DataFlowMessage):
    data_address: DataAddress | None = Field(default=None, alias="dataAddress")


class DataFlowStartedMessage(TolerantModel):
    message_id: StrictStr | None = Field(default=None, alias="messageId")
    data_address: DataAddress | None = Field(default=None, alias="dataAddress")


class DataFlowResumeMessage(DataFlowStartedMessage):
    pass


class DataFlowSuspendMessage(TolerantModel):
    message_id: StrictStr | None = Field(default=None, alias="messageId")
    reason: StrictStr | None = None


class DataFlowTerminateMessage(DataFlowSuspendMessage):
    pass


class DataFlowStatusMessage(TolerantModel):
    """What a signal answers with and what a callback carries; `state` is always present."""

    message_id: StrictStr = Field(default_factory=lambda: str(uuid.uuid4()), alias="messageId")
    data_flow_id: NonEmptyStr = Field(alias="dataFlowId")
    state: FlowState
    data_address: DataAddress | None = Field(default=None, alias="dataAddress")
    error: StrictStr | None = None

    def wire(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class DataFlowStatusResponse(TolerantModel):
    """DPS-08: `GET …/{id}/status`."""

    data_flow_id: NonEmptyStr = Field(alias="dataFlowId")
    state: FlowState


class DataPlaneRegistrationMessage(ContractModel):
    """DPS-10: the body of EDC's data-plane registration, without the authorization profile; the
    transfer types under both names (RC2 `transferTypes`, RC3 `profiles`)."""

    dataplane_id: StrictStr = Field(alias="dataplaneId")
    endpoint: StrictStr
    transfer_types: list[StrictStr] = Field(alias="transferTypes")
    labels: list[StrictStr]

    @computed_field(alias="profiles")  # type: ignore[prop-decorator]
    @property
    def profiles(self) -> list[str]:
        """RC3's name for the same list: a control plane of either release reads its own."""
        return list(self.transfer_types)


class ControlPlaneRegistrationMessage(TolerantModel):
    """DPS-11. The authorization profile is accepted, never stored and never serialised."""

    controlplane_id: NonEmptyStr = Field(alias="controlplaneId")
    endpoint: NonEmptyStr
    authorization: Any = Field(default=None, exclude=True, repr=False)


CallbackAction = Literal["prepared", "started", "completed", "errored"]
CALLBACK_ACTIONS: tuple[str, ...] = get_args(CallbackAction)


# ---------------------------------------------------------------- pull token (DPS-06)


def single_audience(data: Any) -> Any:
    """`aud` may arrive as a one-element list (RFC 7519 allows both); more than one is refused."""
    if isinstance(data, dict) and isinstance(data.get("aud"), list):
        aud = data["aud"]
        if len(aud) != 1:
            raise ValueError("a token of this data plane has exactly one audience")
        data = {**data, "aud": aud[0]}
    return data


class PullTokenClaims(ContractModel):
    """Claims of a pull token. No `exp`, and no flow facts: those are held against the `jti`.

    `aud` may arrive as a one-element list (RFC 7519 allows both); anything else is refused."""

    jti: NonEmptyStr = Field(repr=False)  # the token's id: kept out of logs like the token (DPS-13)
    iss: NonEmptyStr
    sub: NonEmptyStr
    aud: NonEmptyStr
    iat: StrictInt

    @model_validator(mode="before")
    @classmethod
    def _single_audience(cls, data: Any) -> Any:
        return single_audience(data)

    @model_validator(mode="after")
    def _sub_is_iss(self) -> PullTokenClaims:
        if self.sub != self.iss:
            raise ValueError("sub must equal iss")
        return self


class AccessTokenClaims(ContractModel):
    """Claims of an http-pull access token: it expires, names its holder (`sub`, the
    counter-party) and the flow it was issued for. `aud` is the provider participant whose data
    plane serves it. The grant is still read on every pull: the claims only have to agree with it."""

    jti: NonEmptyStr = Field(repr=False)
    iss: NonEmptyStr
    sub: NonEmptyStr
    aud: NonEmptyStr
    iat: StrictInt
    exp: StrictInt
    data_flow_id: NonEmptyStr = Field(alias="dataFlowId")
    dataset_id: NonEmptyStr = Field(alias="datasetId")
    agreement_id: NonEmptyStr = Field(alias="agreementId")

    @model_validator(mode="before")
    @classmethod
    def _single_audience(cls, data: Any) -> Any:
        return single_audience(data)

    def wire(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)


PULL_TOKEN_ALGORITHM = "ES256"

# ---------------------------------------------------------------- pull-grant view (read by the gateway)

PULL_GRANT_VIEW = "dps_pull_grants"
"""A view in signaling's database with one row per live pull token; revocation removes the row."""
PULL_GRANT_COLUMNS: tuple[str, ...] = (
    "token_id",
    "flow_id",
    "state",
    "agreement_id",
    "dataset_id",
    "participant_id",
    "counter_party_id",
    # the flow's grant extensions as JSON text, or NULL: the frozen client range filters
    # (dataplane_contracts.records, docs/records.md)
    "grant_extensions",
)
DEFAULT_PULL_GRANT_ROLE = "dataplane_pull_reader"
PULL_TOKEN_USED_FUNCTION = "dps_pull_token_used"
"""`dps_pull_token_used(token_id text)`: what the gateway calls on an http-pull access token's
first use (the read role's only write): a renewal's pending pair becomes the current one, and the
pair it replaces is dead from then on. A no-op for any other token."""

# ---------------------------------------------------------------- flow event (dataplane.dps.flow-events)

FlowSignal = Literal["prepare", "start", "started", "suspend", "resume", "terminate", "completed"]


class FlowStateChanged(Event):
    """One committed transition, published from the outbox keyed by flow id. Never carries a
    token or token id; duplicates (at-least-once) share `event_id`."""

    flow_id: NonEmptyStr
    signal: FlowSignal
    role: FlowRole
    previous_state: FlowState | None
    state: FlowState
    agreement_id: NonEmptyStr
    dataset_id: NonEmptyStr
    participant_id: NonEmptyStr
    counter_party_id: NonEmptyStr
    transfer_type: NonEmptyStr
