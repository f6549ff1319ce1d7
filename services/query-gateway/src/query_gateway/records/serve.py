"""One records page (docs/records.md): the pull token, the flow's dataset, its frozen filters,
the request's filters and cursor, then the pipeline's records path (pipeline.py, `read_records`):
the same dataspace read as `/dps/public/query` — ds asked, both layers narrowing — with the client
filters as further conditions on the narrowed statement, built and verified in `sql/`; and the
disclosure durable before the page leaves."""

from __future__ import annotations

from dataplane_service_kit.errors import ServiceError
from query_gateway.access_log import AccessContext
from query_gateway.deps import pull_grant, pull_request
from query_gateway.pipeline import RecordsAsk, read_records
from query_gateway.records.changes import Pending, changes_answer
from query_gateway.records.cursor import CursorCodec, filter_set_digest
from query_gateway.records.frozen import bounds_of, check_evaluable, frozen_of, metadata_of
from query_gateway.records.read import Headers
from query_gateway.records.request import parse_records_query, refuse_any_parameter
from query_gateway.records.values import Bound
from query_gateway.sql import KEY_PREFIX, Condition, key_output
from query_gateway.state import Gateway


async def stream_metadata(
    gw: Gateway, h: Headers, dataset_id: str, query_string: bytes, ctx: AccessContext
) -> dict[str, object]:
    """The flow's frozen set and nothing of the current catalogue, even when one of its filters
    cannot be evaluated now."""
    grant = await pull_grant(gw, h.authorization, h.agreement, ctx, dataset_id)
    frozen = frozen_of(grant.grant_extensions, grant.dataset_id)
    refuse_any_parameter(query_string)
    ctx.succeeded()
    return metadata_of(dataset_id, frozen)


async def records_page(
    gw: Gateway,
    codec: CursorCodec | None,
    h: Headers,
    *,
    dataset_id: str,
    query_string: bytes,
    ctx: AccessContext,
    final: bool = True,
) -> dict[str, object] | Pending:
    """`final`: for a change session's long poll, whether this is its last read (else an empty
    answer is Pending)."""
    grant = await pull_grant(gw, h.authorization, h.agreement, ctx, dataset_id)
    frozen = frozen_of(grant.grant_extensions, grant.dataset_id)  # before anything is served
    query = parse_records_query(query_string)
    bounds = bounds_of(query, frozen)  # the frozen set alone decides, before any declaration
    entry = gw.entries.get(dataset_id)
    if entry is None or entry.records is None or codec is None:
        raise ServiceError("not_offered", "records are not offered for this dataset")
    if frozen is not None:
        check_evaluable(bounds, frozen, entry, gw.columns)
    digest = filter_set_digest(bounds)
    if query.changes_since is not None:  # a change session (docs/records.md, "Change sessions")
        return await changes_answer(
            gw,
            codec.sessions,
            grant,
            h=h,
            entry=entry,
            bounds=bounds,
            filters=digest,
            query=query,
            ctx=ctx,
            final=final,
        )
    key = entry.records.key
    after = codec.decode(query.cursor, grant.flow_id, dataset_id, digest, len(key)) if query.cursor else None

    req = pull_request(gw, grant, h.transfer, h.purpose)
    limit = min(query.limit, entry.max_rows or query.limit)  # QE-07: the dataset's cap
    key_types = tuple((k, gw.columns[entry.table][k]) for k in key)
    ask = RecordsAsk(
        tuple(_condition(b) for b in bounds), key_types, tuple(after) if after is not None else None, limit
    )
    page, granted = await read_records(gw, dataset_id, ask, req, ctx)
    rows = page.items[:limit]
    has_more = len(page.items) > limit
    cursor = None
    if has_more:
        last = rows[-1]
        cursor = codec.encode(
            grant.flow_id, dataset_id, digest, [str(last[key_output(i)]) for i in range(len(key))]
        )
    items = [{k: v for k, v in row.items() if not k.startswith(KEY_PREFIX)} for row in rows]
    await granted.disclose(gw, req, len(items))
    ctx.succeeded()
    return {"items": items, "limit": limit, "has_more": has_more, "next_cursor": cursor}


def _condition(b: Bound) -> Condition:
    return Condition(b.field, b.sql_op, b.text, b.sql_type, f"filter {b.field} {b.op}")
