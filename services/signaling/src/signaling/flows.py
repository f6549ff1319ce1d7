"""The DPS state machine (DPS-04 … DPS-08): one transaction per signal, the flow row locked with
SELECT … FOR UPDATE, the outbox row written in the same transaction, committed before the answer
is returned (so a retired token is gone from the pull-grant view when the 200 leaves)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from dataplane_contracts.dps import (
    CallbackAction,
    DataAddress,
    DataFlowPrepareMessage,
    DataFlowStartMessage,
    DataFlowStatusMessage,
    DataFlowStatusResponse,
    FlowRole,
    FlowSignal,
    FlowState,
    FlowStateChanged,
    can_transition,
    canonical_transfer_type,
    http_pull_data_address,
    is_http_pull_profile,
    pull_data_address,
)
from dataplane_service_kit.errors import ServiceError
from dataplane_service_kit.telemetry import kafka_headers
from signaling import repository
from signaling.catalogue import CatalogueSource, frozen_extensions
from signaling.metrics import Metrics
from signaling.repository import FlowExists, FlowRecord
from signaling.tokens import PullTokenSigner, TokenPair


def _event(
    flow: FlowRecord, signal: FlowSignal, previous: FlowState | None, state: FlowState
) -> FlowStateChanged:
    return FlowStateChanged(
        flow_id=flow.id,
        signal=signal,
        role=flow.role,
        previous_state=previous,
        state=state,
        agreement_id=flow.agreement_id,
        dataset_id=flow.dataset_id,
        participant_id=flow.participant_id,
        counter_party_id=flow.counter_party_id,
        transfer_type=flow.transfer_type,
    )


def _stored(address: DataAddress | None) -> dict[str, Any] | None:
    return None if address is None else address.without_credentials().wire()


# a flow's access token and (http-pull) its refresh token, and any renewal's pending pair: retired
# together
_CREDENTIAL_COLUMNS = ("token_id", "refresh_hash", "pending_token_id", "pending_refresh_hash")


@dataclass(frozen=True)
class Advanced:
    """The callback an asynchronous completion sends (`action`, `message`), or none."""

    action: CallbackAction | None
    message: DataFlowStatusMessage | None


def _not_found() -> ServiceError:
    return ServiceError("flow_not_found", "no such data flow")


def _conflict(flow: FlowRecord, signal: str) -> ServiceError:
    return ServiceError("invalid_transition", f"{signal} is not allowed for a {flow.state.value} data flow")


class FlowService:
    def __init__(
        self,
        engine: AsyncEngine,
        signer: PullTokenSigner,
        public_url: str,
        transfer_types: list[str],
        *,
        metrics: Metrics,
        on_commit: Callable[[], None] = lambda: None,
        refresh_endpoint: str = "",
        catalogue: CatalogueSource | None = None,
        asynchronous: bool = False,
    ) -> None:
        self._engine = engine
        self._signer = signer
        self._metrics = metrics
        self._public_url = public_url
        self._types = {canonical_transfer_type(t) for t in transfer_types}
        self._on_commit = on_commit
        self._refresh_endpoint = refresh_endpoint
        self._catalogue = catalogue
        self.asynchronous = asynchronous
        # set by whoever delivers the callbacks (app.py: the CallbackRelay's wake)
        self.on_callback_owed: Callable[[], None] = lambda: None

    def _check_type(self, transfer_type: str) -> str:
        """The type as this data plane records it (the http-pull profile under its URI)."""
        canonical = canonical_transfer_type(transfer_type)
        if canonical not in self._types:
            raise ServiceError(
                "unsupported_transfer_type", "this data plane does not serve that transfer type"
            )
        return canonical

    def _issue(self, flow: FlowRecord) -> tuple[dict[str, Any], DataAddress]:
        """A provider flow's new credentials: the columns to store (ids and hashes only) and the
        address that carries them, by the flow's transfer type (DPS-05/06 or the http-pull profile)."""
        if is_http_pull_profile(flow.transfer_type):
            pair = self._signer.issue_pair(
                flow.id, flow.participant_id, flow.counter_party_id, flow.dataset_id, flow.agreement_id
            )
            return self._pair_values(pair), self._pair_address(pair)
        token, claims = self._signer.issue(flow.participant_id, flow.counter_party_id)
        return {"token_id": claims.jti}, pull_data_address(self._public_url, token)

    @staticmethod
    def _pair_values(pair: TokenPair) -> dict[str, Any]:
        # a new pair replaces whatever renewal was pending
        return {
            "token_id": pair.access_id,
            "refresh_hash": pair.refresh_hash,
            "pending_token_id": None,
            "pending_refresh_hash": None,
        }

    def _pair_address(self, pair: TokenPair) -> DataAddress:
        return http_pull_data_address(
            self._public_url, pair.access_token, pair.refresh_token, pair.expires_in, self._refresh_endpoint
        )

    async def _create(
        self, flow: FlowRecord, values: dict[str, Any], signal: FlowSignal, owed: CallbackAction | None = None
    ) -> None:
        """Insert the flow with its event; an asynchronous signal's callback (`owed`) in the same
        transaction, refused up front when it could go nowhere (fail closed: a 202 promises it)."""
        async with self._engine.begin() as conn:
            if owed is not None and not (
                flow.callback_address or await repository.registered_endpoint(conn, flow.caller)
            ):
                raise ServiceError(
                    "callback_address_required",
                    "an asynchronous signal needs a callbackAddress or a registered control plane",
                )
            try:
                await repository.insert_flow(conn, values)
            except FlowExists:
                raise ServiceError("flow_exists", "a data flow with this id exists") from None
            await repository.add_event(conn, _event(flow, signal, None, flow.state), kafka_headers())
            if owed is not None:
                await repository.add_callback(conn, flow.id, owed)
        self._on_commit()
        if owed is not None:
            self.on_callback_owed()

    @staticmethod
    def _new_values(
        msg: DataFlowPrepareMessage | DataFlowStartMessage, role: FlowRole, state: FlowState, caller: str
    ) -> dict[str, Any]:
        return {
            "id": msg.flow_id,
            "role": role.value,
            "state": state.value,
            "caller": caller,
            "participant_id": msg.participant_id,
            "counter_party_id": msg.counter_party_id,
            "agreement_id": msg.agreement_id,
            "dataset_id": msg.dataset_id,
            "transfer_type": msg.transfer_type,
            "dataspace_context": msg.dataspace_context,
            "callback_address": msg.callback_address,
            "claims": msg.claims,
            "labels": msg.labels,
            "metadata": msg.metadata,
            "data_address": None,
            "token_id": None,
            "refresh_hash": None,
            "pending_token_id": None,
            "pending_refresh_hash": None,
            "grant_extensions": None,
        }

    # ------------------------------------------------------------------ creation
    async def prepare(self, msg: DataFlowPrepareMessage, caller: str) -> DataFlowStatusMessage:
        """DPS-04: the consumer side; PREPARED, no data address. Asynchronous: PREPARING, and the
        `prepared` callback owes the rest (`advance`)."""
        transfer_type = self._check_type(msg.transfer_type)
        state = FlowState.PREPARING if self.asynchronous else FlowState.PREPARED
        values = self._new_values(msg, FlowRole.CONSUMER, state, caller)
        values["transfer_type"] = transfer_type
        await self._create(
            FlowRecord.from_values(values), values, "prepare", "prepared" if self.asynchronous else None
        )
        return DataFlowStatusMessage(data_flow_id=msg.flow_id, state=state)

    async def start(self, msg: DataFlowStartMessage, caller: str) -> DataFlowStatusMessage:
        """DPS-05/06: the provider side of a pull; STARTED with the pull address and a new token.
        Asynchronous: STARTING without a token; the `started` callback carries the address."""
        transfer_type = self._check_type(msg.transfer_type)
        if msg.data_address is not None:
            raise ServiceError("data_address_not_allowed", "a pull start must not carry a data address")
        # frozen when the start arrives, for the life of the flow: nothing writes this column again
        # (resume and an asynchronous start's completion keep it)
        frozen = frozen_extensions(self._catalogue, msg.dataset_id, msg.metadata)
        if self.asynchronous:
            values = self._new_values(msg, FlowRole.PROVIDER, FlowState.STARTING, caller)
            values["transfer_type"] = transfer_type
            values["grant_extensions"] = frozen
            await self._create(FlowRecord.from_values(values), values, "start", "started")
            return DataFlowStatusMessage(data_flow_id=msg.flow_id, state=FlowState.STARTING)
        values = self._new_values(msg, FlowRole.PROVIDER, FlowState.STARTED, caller)
        values["transfer_type"] = transfer_type
        values["grant_extensions"] = frozen
        credentials, address = self._issue(FlowRecord.from_values(values))
        values.update(credentials)
        await self._create(FlowRecord.from_values(values), values, "start")
        self._metrics.tokens_issued.inc()
        return DataFlowStatusMessage(data_flow_id=msg.flow_id, state=FlowState.STARTED, data_address=address)

    # ------------------------------------------------------------------ asynchronous completion
    async def advance(self, conn: AsyncConnection, flow: FlowRecord, action: str) -> Advanced:
        """What an owed `prepared`/`started` callback says, the flow (locked by the caller's
        transaction) moved on first: PREPARING → PREPARED; STARTING → STARTED with new
        credentials. A flow already there (an earlier attempt's answer never confirmed) is
        announced again; a provider flow gets new credentials again, the previous ones dying with
        them: only the address sent last is live. A flow that went elsewhere meanwhile
        (terminated) owes nothing more; one whose transfer type this data plane no longer serves
        is terminated and `errored` is sent."""
        target = {"prepared": FlowState.PREPARED, "started": FlowState.STARTED}.get(action)
        if target is None:
            raise ValueError(f"no asynchronous completion named {action!r}")
        moving = flow.state is {"prepared": FlowState.PREPARING, "started": FlowState.STARTING}[action]
        if not moving and flow.state is not target:
            return Advanced(None, None)  # it went elsewhere (terminated): nothing left to announce
        if flow.role is FlowRole.CONSUMER:  # prepared: the only consumer completion
            if moving:
                await self._commit_transition(conn, flow, "prepare", target, {})
            return Advanced("prepared", DataFlowStatusMessage(data_flow_id=flow.id, state=target))
        if canonical_transfer_type(flow.transfer_type) not in self._types:
            retired = dict.fromkeys(_CREDENTIAL_COLUMNS)
            await self._commit_transition(conn, flow, "terminate", FlowState.TERMINATED, retired)
            why = "this data plane no longer serves the flow's transfer type"
            ended = DataFlowStatusMessage(data_flow_id=flow.id, state=FlowState.TERMINATED, error=why)
            return Advanced("errored", ended)
        credentials, address = self._issue(flow)
        if moving:
            await self._commit_transition(conn, flow, "start", target, credentials)
        else:
            await repository.update_flow(conn, flow.id, credentials)
        self._metrics.tokens_issued.inc()
        return Advanced(
            "started", DataFlowStatusMessage(data_flow_id=flow.id, state=target, data_address=address)
        )

    # ------------------------------------------------------------------ transitions (DPS-07)
    async def _commit_transition(
        self,
        conn: AsyncConnection,
        flow: FlowRecord,
        signal: FlowSignal,
        target: FlowState,
        values: dict[str, Any],
    ) -> None:
        if not can_transition(flow.state, target):
            raise _conflict(flow, signal)
        await repository.update_flow(conn, flow.id, {"state": target.value, **values})
        await repository.add_event(conn, _event(flow, signal, flow.state, target), kafka_headers())

    async def _retiring(self, flow_id: str, caller: str, signal: FlowSignal, target: FlowState) -> None:
        async with self._engine.begin() as conn:
            flow = await repository.lock_flow(conn, flow_id, caller)
            if flow is None:
                raise _not_found()
            if signal == "terminate" and flow.state is FlowState.TERMINATED:
                return  # idempotent: nothing changes, no event
            # the access token and (http-pull) its refresh token die together, and any renewal's
            # pending pair with them
            retired = dict.fromkeys(_CREDENTIAL_COLUMNS)
            await self._commit_transition(conn, flow, signal, target, retired)
        self._on_commit()
        if flow.token_id is not None:
            self._metrics.tokens_retired.inc()

    async def suspend(self, flow_id: str, caller: str) -> None:
        await self._retiring(flow_id, caller, "suspend", FlowState.SUSPENDED)

    async def terminate(self, flow_id: str, caller: str) -> None:
        await self._retiring(flow_id, caller, "terminate", FlowState.TERMINATED)

    async def completed(self, flow_id: str, caller: str) -> None:
        await self._retiring(flow_id, caller, "completed", FlowState.COMPLETED)

    async def started(self, flow_id: str, address: DataAddress | None, caller: str) -> None:
        """Consumer flows only: PREPARED → STARTED, recording the provider's address sans credential."""
        async with self._engine.begin() as conn:
            flow = await repository.lock_flow(conn, flow_id, caller)
            if flow is None:
                raise _not_found()
            if flow.role is FlowRole.PROVIDER:
                raise ServiceError("invalid_transition", "started is a consumer-side signal")
            if address is None:
                raise ServiceError("data_address_required", "started must carry the data address")
            if flow.state is not FlowState.PREPARED:
                raise _conflict(flow, "started")
            await self._commit_transition(
                conn, flow, "started", FlowState.STARTED, {"data_address": _stored(address)}
            )
        self._on_commit()

    async def resume(self, flow_id: str, address: DataAddress | None, caller: str) -> DataFlowStatusMessage:
        """SUSPENDED → STARTED. A provider flow gets a new token (the old one stays dead) and any
        address in the message is ignored; a consumer flow records the address it is given."""
        issued: DataAddress | None = None
        async with self._engine.begin() as conn:
            flow = await repository.lock_flow(conn, flow_id, caller)
            if flow is None:
                raise _not_found()
            if flow.state is not FlowState.SUSPENDED:
                raise _conflict(flow, "resume")
            values: dict[str, Any] = {}
            if flow.role is FlowRole.PROVIDER:
                values, issued = self._issue(flow)
            elif address is not None:
                values["data_address"] = _stored(address)
            await self._commit_transition(conn, flow, "resume", FlowState.STARTED, values)
        self._on_commit()
        if issued is None:
            return DataFlowStatusMessage(data_flow_id=flow_id, state=FlowState.STARTED)
        self._metrics.tokens_issued.inc()
        return DataFlowStatusMessage(data_flow_id=flow_id, state=FlowState.STARTED, data_address=issued)

    async def status(self, flow_id: str, caller: str) -> DataFlowStatusResponse:
        async with self._engine.connect() as conn:
            flow = await repository.get_flow(conn, flow_id, caller)
        if flow is None:
            raise _not_found()
        return DataFlowStatusResponse(data_flow_id=flow.id, state=flow.state)
