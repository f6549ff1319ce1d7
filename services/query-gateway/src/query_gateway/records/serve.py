"""One records page (docs/records.md): the pull token, the flow's dataset, its frozen filters,
the request's filters and cursor, then the same dataspace read as `/dps/public/query` — ds asked,
both layers narrowing — with the client filters as further conditions on the narrowed statement,
and the disclosure durable before the page leaves."""

from __future__ import annotations

from dataplane_service_kit.errors import ServiceError
from query_gateway.access_log import AccessContext
from query_gateway.deps import pull_grant
from query_gateway.records.changes import Pending, changes_answer
from query_gateway.records.cursor import CursorCodec, filter_set_digest
from query_gateway.records.frozen import bounds_of, check_evaluable, frozen_of, metadata_of
from query_gateway.records.read import Headers, dataspace_read
from query_gateway.records.request import parse_records_query, refuse_any_parameter
from query_gateway.records.values import Bound
from query_gateway.sql.model import NarrowedQuery
from query_gateway.sql.scope import quoted as _ident
from query_gateway.state import Gateway

_KEY_PREFIX = "_dp_key"  # the reserved prefix: no column of a dataset can be called that


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

    req, granted = await dataspace_read(gw, grant, h, ctx)
    key_types = [gw.columns[entry.table][k] for k in key]
    statement = _filtered(granted.narrowed, bounds, key, key_types, after)
    limit = min(query.limit, entry.max_rows or query.limit)  # QE-07: the dataset's cap
    page = await gw.executor.run(statement, offset=0, limit=limit + 1, skip_count=True)
    rows = page.items[:limit]
    has_more = len(page.items) > limit
    cursor = None
    if has_more:
        last = rows[-1]
        cursor = codec.encode(
            grant.flow_id, dataset_id, digest, [str(last[f"{_KEY_PREFIX}{i}"]) for i in range(len(key))]
        )
    items = [{k: v for k, v in row.items() if not k.startswith(_KEY_PREFIX)} for row in rows]
    await granted.disclose(gw, req, len(items))
    ctx.succeeded()
    return {"items": items, "limit": limit, "has_more": has_more, "next_cursor": cursor}


def _filtered(
    narrowed: NarrowedQuery,
    bounds: tuple[Bound, ...],
    key: list[str],
    key_types: list[str],
    after: list[str] | None,
) -> NarrowedQuery:
    """The narrowed statement as the rows it may read, further conditions on its output only (so
    they can narrow and never widen), every value a bound parameter read by PostgreSQL from
    text into the compared type; the record key's text beside each row for the cursor; ordered
    by the record key."""
    params: list[object] = list(narrowed.params)
    conds: list[str] = []
    for b in bounds:
        params.append(b.text)
        conds.append(f"r.{_ident(b.field)} {b.sql_op} ${len(params)}::text::{b.sql_type}")
    if after is not None:
        placeholders = []
        for value, pg_type in zip(after, key_types, strict=True):
            params.append(value)
            placeholders.append(f"${len(params)}::text::{pg_type}")
        columns = ", ".join(f"r.{_ident(k)}" for k in key)
        conds.append(f"({columns}) > ({', '.join(placeholders)})")
    key_text = ", ".join(f"r.{_ident(k)}::text AS {_KEY_PREFIX}{i}" for i, k in enumerate(key))
    where = " AND ".join(conds) if conds else "TRUE"
    sql = f"SELECT r.*, {key_text} FROM ({narrowed.sql}) AS r WHERE {where}"  # noqa: S608 - bound values
    return NarrowedQuery(
        sql=sql,
        params=tuple(params),
        param_labels=(*narrowed.param_labels, *(f"filter {b.field} {b.op}" for b in bounds)),
        denied=narrowed.denied,
        order_by=" ORDER BY " + ", ".join(f"q.{_ident(k)} ASC" for k in key),
    )
