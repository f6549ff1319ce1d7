"""The DPS state machine (DPS-04 … DPS-08): one transaction per signal, the flow row locked with
SELECT … FOR UPDATE, the outbox row written in the same transaction, committed before the answer
is returned (so a retired token is gone from the pull-grant view when the 200 leaves)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from dataplane_contracts.dps import (
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
from signaling import metrics, repository
from signaling.catalogue import CatalogueSource, frozen_extensions
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
        on_commit: Callable[[], None] = lambda: None,
        refresh_endpoint: str = "",
        catalogue: CatalogueSource | None = None,
    ) -> None:
        self._engine = engine
        self._signer = signer
        self._public_url = public_url
        self._types = {canonical_transfer_type(t) for t in transfer_types}
        self._on_commit = on_commit
        self._refresh_endpoint = refresh_endpoint
        self._catalogue = catalogue

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

    async def _create(self, flow: FlowRecord, values: dict[str, Any], signal: FlowSignal) -> None:
        async with self._engine.begin() as conn:
            try:
                await repository.insert_flow(conn, values)
            except FlowExists:
                raise ServiceError("flow_exists", "a data flow with this id exists") from None
            await repository.add_event(conn, _event(flow, signal, None, flow.state), kafka_headers())
        self._on_commit()

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

    @staticmethod
    def _record(values: dict[str, Any]) -> FlowRecord:
        return FlowRecord(
            id=values["id"],
            role=FlowRole(values["role"]),
            state=FlowState(values["state"]),
            caller=values["caller"],
            participant_id=values["participant_id"],
            counter_party_id=values["counter_party_id"],
            agreement_id=values["agreement_id"],
            dataset_id=values["dataset_id"],
            transfer_type=values["transfer_type"],
            callback_address=values["callback_address"],
            data_address=None,
            token_id=values["token_id"],
        )

    # ------------------------------------------------------------------ creation
    async def prepare(self, msg: DataFlowPrepareMessage, caller: str) -> DataFlowStatusMessage:
        """DPS-04: the consumer side; PREPARED, no data address."""
        transfer_type = self._check_type(msg.transfer_type)
        values = self._new_values(msg, FlowRole.CONSUMER, FlowState.PREPARED, caller)
        values["transfer_type"] = transfer_type
        await self._create(self._record(values), values, "prepare")
        return DataFlowStatusMessage(data_flow_id=msg.flow_id, state=FlowState.PREPARED)

    async def start(self, msg: DataFlowStartMessage, caller: str) -> DataFlowStatusMessage:
        """DPS-05/06: the provider side of a pull; STARTED with the pull address and a new token."""
        transfer_type = self._check_type(msg.transfer_type)
        if msg.data_address is not None:
            raise ServiceError("data_address_not_allowed", "a pull start must not carry a data address")
        values = self._new_values(msg, FlowRole.PROVIDER, FlowState.STARTED, caller)
        values["transfer_type"] = transfer_type
        # frozen now, for the life of the flow: nothing writes this column again (resume keeps it)
        values["grant_extensions"] = frozen_extensions(self._catalogue, msg.dataset_id, msg.metadata)
        credentials, address = self._issue(self._record(values))
        values.update(credentials)
        await self._create(self._record(values), values, "start")
        metrics.TOKENS_ISSUED.inc()
        return DataFlowStatusMessage(data_flow_id=msg.flow_id, state=FlowState.STARTED, data_address=address)

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
            retired = dict.fromkeys(("token_id", "refresh_hash", "pending_token_id", "pending_refresh_hash"))
            await self._commit_transition(conn, flow, signal, target, retired)
        self._on_commit()
        if flow.token_id is not None:
            metrics.TOKENS_RETIRED.inc()

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
        metrics.TOKENS_ISSUED.inc()
        return DataFlowStatusMessage(data_flow_id=flow_id, state=FlowState.STARTED, data_address=issued)

    async def status(self, flow_id: str, caller: str) -> DataFlowStatusResponse:
        async with self._engine.connect() as conn:
            flow = await repository.get_flow(conn, flow_id, caller)
        if flow is None:
            raise _not_found()
        return DataFlowStatusResponse(data_flow_id=flow.id, state=flow.state)
