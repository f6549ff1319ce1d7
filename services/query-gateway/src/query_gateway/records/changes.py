"""One answer of a `changes_since` session (docs/records.md, "Change sessions"): the records of
the flow's dataset that changed since the token's position, up to the horizon, in change order —
each one visible now (ds's verdict, both layers, the soft-delete column and the client filters)
returned whole, every other one a tombstone carrying its key alone.

The session is a dataspace read like a page: the token checked before ds is asked (400
invalid_cursor), ds asked, both layers narrowing, and the disclosure of what is delivered
durable before the answer leaves (RF-10). A token issued under another visibility context — ds's
verdict or the resolved row filters changed, or the projection — is 409 resync_required: the
rows that left through such a change are not among the changed rows, so an answer would leave
them in the client's copy."""

from __future__ import annotations

from dataclasses import dataclass

from dataplane_contracts.catalogue import DatasetEntry
from dataplane_service_kit.errors import ServiceError
from query_gateway.access_log import AccessContext
from query_gateway.clients.pull import VerifiedPull
from query_gateway.pipeline import ChangesAsk, read_changes
from query_gateway.records.changes_token import BEGINNING, Session, SessionCodec
from query_gateway.records.read import Headers, dataspace_read
from query_gateway.records.request import RecordsQuery
from query_gateway.records.values import Bound
from query_gateway.sql import (
    CHANGE,
    HORIZON,
    VISIBLE,
    ChangeOrder,
    Position,
    RangeCondition,
)
from query_gateway.sql import CHANGE_KEY_PREFIX as KEY_PREFIX
from query_gateway.state import Gateway

START = Position("0", None, None)


@dataclass(frozen=True)
class Pending:
    """A long poll's answer that would be empty: nothing delivered, nothing disclosed; the
    request waits for a change at or above `since` (None: for its time only) and reads again."""

    table: str
    column: str
    since: int | None
    wait_s: int  # the request's `wait`


def change_order(gw: Gateway, entry: DatasetEntry) -> ChangeOrder:
    """The dataset's declared change order; 403 not_offered when it declares none."""
    records = entry.records
    if records is None or records.changes is None:
        raise ServiceError("not_offered", "changes_since sessions are not offered for this dataset")
    types = gw.columns[entry.table]
    deleted = records.changes.deleted
    return ChangeOrder(
        table=entry.table,
        column=records.changes.column,
        deleted=deleted,
        deleted_type=types[deleted] if deleted is not None else None,
        key=tuple(records.key),
        key_types=tuple(types[k] for k in records.key),
    )


def _resync() -> ServiceError:
    return ServiceError(
        "resync_required",
        "what this flow may see changed since the token was issued: start again from changes_since=beginning",
    )


async def changes_answer(
    gw: Gateway,
    sessions: SessionCodec,
    grant: VerifiedPull,
    *,
    h: Headers,
    entry: DatasetEntry,
    bounds: tuple[Bound, ...],
    filters: str,
    query: RecordsQuery,
    ctx: AccessContext,
    final: bool = True,
) -> dict[str, object] | Pending:
    """`final` False (a long poll with time left): an answer with nothing in it is Pending."""
    order = change_order(gw, entry)
    token = query.changes_since
    assert token is not None
    was: Session | None = None
    if token != BEGINNING:
        was = sessions.decode(token, grant.flow_id, grant.dataset_id, filters, len(order.key))
    req, granted = await dataspace_read(gw, grant, h, ctx)
    narrowed = granted.narrowed
    context = sessions.digest(narrowed.sql, narrowed.params, narrowed.denied)
    projection = sessions.digest(*(d.as_json() for d in narrowed.exposure))
    if was is not None and (was.context, was.projection) != (context, projection):
        raise _resync()
    position = was.position if was is not None else START
    limit = min(query.limit, entry.max_rows or query.limit)  # QE-07: the dataset's cap
    items: list[dict[str, object]] = []
    has_more = False
    if not narrowed.denied:  # a deny reads nothing: the position stays where it was
        conditions = tuple(RangeCondition(b.field, b.sql_op, b.text, b.sql_type) for b in bounds)
        # built, verified (QE-12) and run within the consumer's share (QE-10) in the pipeline
        page = await read_changes(gw, granted, ChangesAsk(order, conditions, position, limit + 1), req)
        changed = [row for row in page.items if row[CHANGE] is not None]
        has_more = len(changed) > limit
        changed = changed[:limit]
        items = [_delivered(row, order.key) for row in changed]
        position = _next(position, page.items, changed, has_more, len(order.key))
    if not final and not items and query.wait:
        since = None if narrowed.denied else int(position.change)
        return Pending(order.table, order.column, since, query.wait)
    await granted.disclose(gw, req, len(items))  # RF-10: a tombstone discloses a key too
    ctx.succeeded()
    next_token = sessions.encode(
        grant.flow_id, grant.dataset_id, filters, Session(projection, context, position)
    )
    return {"items": items, "limit": limit, "has_more": has_more, "next_changes_since": next_token}


def _delivered(row: dict[str, object], key: tuple[str, ...]) -> dict[str, object]:
    if not row[VISIBLE]:
        value = row[key[0]] if len(key) == 1 else [row[k] for k in key]
        return {"key": value, "tombstone": True}
    return {k: v for k, v in row.items() if not k.startswith("_dp_")}


def _next(
    was: Position, rows: list[dict[str, object]], changed: list[dict[str, object]], has_more: bool, n_key: int
) -> Position:
    """After a cut page, just past its last row; else the horizon: every row whose change is
    below it has been answered (never behind where the session stood). The floor is the first
    answer's horizon, kept for the session's life."""
    horizon = int(str(rows[0][HORIZON])) if rows else int(was.change)
    floor = was.floor if was.floor is not None else str(horizon)
    if has_more:
        last = changed[-1]
        key = tuple(str(last[f"{KEY_PREFIX}{i}"]) for i in range(n_key))
        return Position(str(last[CHANGE]), key, floor)
    return Position(str(max(horizon, int(was.change))), None, floor)
