"""SQL of the flows database. Every function takes the connection of the caller's transaction;
the service layer decides where a unit of work begins and commits."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from dataplane_contracts.dps import DataAddress, FlowRole, FlowState, FlowStateChanged
from dataplane_contracts.topics import FLOW_EVENTS
from signaling.tables import callbacks, client_jtis, control_planes, data_flows, outbox


class FlowExists(Exception):
    pass


@dataclass(frozen=True)
class FlowRecord:
    id: str
    role: FlowRole
    state: FlowState
    caller: str
    participant_id: str
    counter_party_id: str
    agreement_id: str
    dataset_id: str
    transfer_type: str
    callback_address: str | None
    data_address: DataAddress | None
    token_id: str | None

    @classmethod
    def from_row(cls, row: Any) -> FlowRecord:
        return cls.from_values(row._mapping)

    @classmethod
    def from_values(cls, m: Mapping[str, Any]) -> FlowRecord:
        """A flow from its columns: a row read, or the values a new flow is inserted with."""
        return cls(
            id=m["id"],
            role=FlowRole(m["role"]),
            state=FlowState(m["state"]),
            caller=m["caller"],
            participant_id=m["participant_id"],
            counter_party_id=m["counter_party_id"],
            agreement_id=m["agreement_id"],
            dataset_id=m["dataset_id"],
            transfer_type=m["transfer_type"],
            callback_address=m["callback_address"],
            data_address=None if m["data_address"] is None else DataAddress.model_validate(m["data_address"]),
            token_id=m["token_id"],
        )


def now() -> datetime:
    return datetime.now(UTC)


async def insert_flow(conn: AsyncConnection, values: dict[str, Any]) -> None:
    """Insert a new flow; a taken id (or token id) is FlowExists. Runs in a savepoint so the
    conflict leaves the caller's transaction usable."""
    stamp = now()
    try:
        async with conn.begin_nested():
            await conn.execute(data_flows.insert().values(created_at=stamp, updated_at=stamp, **values))
    except IntegrityError as exc:
        raise FlowExists from exc


async def lock_flow(conn: AsyncConnection, flow_id: str, caller: str) -> FlowRecord | None:
    """The caller's flow, locked until the transaction ends (signals on one flow are serialised)."""
    stmt = (
        select(data_flows).where(data_flows.c.id == flow_id, data_flows.c.caller == caller).with_for_update()
    )
    row = (await conn.execute(stmt)).first()
    return None if row is None else FlowRecord.from_row(row)


@dataclass(frozen=True)
class RefreshedPair:
    """The pair a presented refresh token belongs to: its access token's id, and whether it is a
    renewal's pending pair (not yet used) or the flow's current one."""

    access_id: str
    pending: bool


async def flow_by_refresh(
    conn: AsyncConnection, digest: str, *, lock: bool
) -> tuple[FlowRecord, RefreshedPair] | None:
    """The flow holding this refresh-token hash (current or pending); with `lock`, locked like
    `lock_flow`."""
    stmt = select(data_flows).where(
        (data_flows.c.refresh_hash == digest) | (data_flows.c.pending_refresh_hash == digest)
    )
    if lock:
        stmt = stmt.with_for_update()
    row = (await conn.execute(stmt)).first()
    if row is None:
        return None
    m = row._mapping
    pending = m["pending_refresh_hash"] == digest
    access_id = m["pending_token_id"] if pending else m["token_id"]
    if access_id is None:
        return None
    return FlowRecord.from_row(row), RefreshedPair(access_id, pending)


async def remember_client_jti(conn: AsyncConnection, issuer: str, jti: str, expires_at: datetime) -> bool:
    """Record a client JWT's id until it expires; False when it was seen before (a replay).
    Expired ids are dropped first: a JWT past its `exp` is refused before it gets here."""
    await conn.execute(client_jtis.delete().where(client_jtis.c.expires_at < now()))
    stmt = (
        pg_insert(client_jtis)
        .values(issuer=issuer, jti=jti, expires_at=expires_at)
        .on_conflict_do_nothing()
        .returning(client_jtis.c.jti)
    )
    return (await conn.execute(stmt)).first() is not None


async def lock_flow_by_id(conn: AsyncConnection, flow_id: str) -> FlowRecord | None:
    """A flow whoever created it, locked like `lock_flow` (the callback relay's side)."""
    row = (await conn.execute(select(data_flows).where(data_flows.c.id == flow_id).with_for_update())).first()
    return None if row is None else FlowRecord.from_row(row)


async def get_flow(conn: AsyncConnection, flow_id: str, caller: str) -> FlowRecord | None:
    stmt = select(data_flows).where(data_flows.c.id == flow_id, data_flows.c.caller == caller)
    row = (await conn.execute(stmt)).first()
    return None if row is None else FlowRecord.from_row(row)


async def update_flow(conn: AsyncConnection, flow_id: str, values: dict[str, Any]) -> None:
    await conn.execute(
        update(data_flows).where(data_flows.c.id == flow_id).values(updated_at=now(), **values)
    )


async def flows_by_state(conn: AsyncConnection) -> dict[str, int]:
    rows = await conn.execute(select(data_flows.c.state, func.count()).group_by(data_flows.c.state))
    return {state: count for state, count in rows.tuples()}


# ------------------------------------------------------------------ control planes (DPS-11)


async def register_control_plane(
    conn: AsyncConnection, controlplane_id: str, endpoint: str, caller: str
) -> bool:
    """Register or replace; False when the id belongs to another caller (the statement itself
    enforces ownership, so two callers racing cannot both win)."""
    stmt = pg_insert(control_planes).values(
        controlplane_id=controlplane_id, endpoint=endpoint, registered_by=caller, updated_at=now()
    )
    upsert = stmt.on_conflict_do_update(
        index_elements=[control_planes.c.controlplane_id],
        set_={"endpoint": stmt.excluded.endpoint, "updated_at": stmt.excluded.updated_at},
        where=control_planes.c.registered_by == caller,
    ).returning(control_planes.c.controlplane_id)
    return (await conn.execute(upsert)).first() is not None


async def delete_control_plane(conn: AsyncConnection, controlplane_id: str, caller: str) -> bool:
    stmt = control_planes.delete().where(
        control_planes.c.controlplane_id == controlplane_id, control_planes.c.registered_by == caller
    )
    return (await conn.execute(stmt)).rowcount > 0


async def registered_endpoint(conn: AsyncConnection, caller: str) -> str | None:
    """The endpoint the caller registered most recently (the DPS-12 fallback callback base)."""
    stmt = (
        select(control_planes.c.endpoint)
        .where(control_planes.c.registered_by == caller)
        .order_by(control_planes.c.updated_at.desc())
        .limit(1)
    )
    return (await conn.execute(stmt)).scalar()


# ------------------------------------------------------------------ outbox


async def add_event(conn: AsyncConnection, event: FlowStateChanged, headers: list[tuple[str, bytes]]) -> None:
    """Written in the transition's own transaction: the event exists iff the transition committed.
    The trace headers are captured now so the relay publishes them under the request's trace."""
    await conn.execute(
        outbox.insert().values(
            event_id=event.event_id,
            topic=FLOW_EVENTS,
            key=event.flow_id,
            payload=event.model_dump(mode="json"),
            headers=[[k, v.decode()] for k, v in headers],
            created_at=now(),
        )
    )


# ------------------------------------------------------------------ callbacks owed (async signals)


@dataclass(frozen=True)
class OwedCallback:
    id: int
    flow_id: str
    action: str
    attempts: int


async def add_callback(conn: AsyncConnection, flow_id: str, action: str) -> None:
    """Written in the transaction that creates the PREPARING/STARTING flow it will announce."""
    stamp = now()
    await conn.execute(
        callbacks.insert().values(
            flow_id=flow_id, action=action, attempts=0, next_attempt_at=stamp, created_at=stamp
        )
    )


async def claim_callback(conn: AsyncConnection, lease: Callable[[int], timedelta]) -> OwedCallback | None:
    """The oldest due callback no other transaction holds, leased: its next attempt is pushed
    `lease(attempt)` ahead now, so no other replica takes it while this attempt may still run,
    and if this process dies before it is finished it is due again then."""
    row = (
        await conn.execute(
            select(callbacks.c.id, callbacks.c.flow_id, callbacks.c.action, callbacks.c.attempts)
            .where(callbacks.c.finished_at.is_(None), callbacks.c.next_attempt_at <= now())
            .order_by(callbacks.c.next_attempt_at, callbacks.c.id)
            .limit(1)
            .with_for_update(skip_locked=True)
        )
    ).first()
    if row is None:
        return None
    owed = OwedCallback(row.id, row.flow_id, row.action, row.attempts + 1)
    await conn.execute(
        update(callbacks)
        .where(callbacks.c.id == owed.id)
        .values(attempts=owed.attempts, next_attempt_at=now() + lease(owed.attempts))
    )
    return owed


async def finish_callback(conn: AsyncConnection, callback_id: int, outcome: str) -> None:
    await conn.execute(
        update(callbacks)
        .where(callbacks.c.id == callback_id)
        .values(finished_at=now(), outcome=outcome, last_error=None)
    )


async def callback_failed(conn: AsyncConnection, callback_id: int, reason: str, retry_in: timedelta) -> None:
    """The attempt failed: due again `retry_in` from now (replacing the claim's longer lease)."""
    await conn.execute(
        update(callbacks)
        .where(callbacks.c.id == callback_id)
        .values(last_error=reason[:255], next_attempt_at=now() + retry_in)
    )


async def next_callback_due(conn: AsyncConnection) -> datetime | None:
    stmt = select(func.min(callbacks.c.next_attempt_at)).where(callbacks.c.finished_at.is_(None))
    due: datetime | None = (await conn.execute(stmt)).scalar()
    return due
