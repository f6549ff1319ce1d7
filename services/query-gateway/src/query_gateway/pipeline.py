"""A query, written once for every path: validate → judge → plan → narrow → execute → disclose.

The normal path judges the caller against the catalogue (docs/gateway.md: policy, platform-admin,
both layers for the caller); the dataspace paths (legacy EDR, DPS pull, records) judge ds's one
decision for every touched dataset (RF-01, RF-02, RF-06), the catalogue's organization layer on
the consumer's organizations (GS-13), and make the disclosure durable before any row leaves
(RF-10). What is judged is decided in `rules/`; who is asked, in `clients/`; this module only says
in which order, and tells the access record what it learned."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from dataplane_contracts.catalogue import PURE_HANDLERS, Binds, DatasetEntry
from dataplane_contracts.ds import AuthorizeRequest
from dataplane_contracts.plans import CallerIdentity, ClaimCheck, Plan
from dataplane_service_kit.errors import ServiceError
from dataplane_service_kit.logs import get_logger
from query_gateway.access_log import AccessContext
from query_gateway.rules.caller import Caller
from query_gateway.rules.layers import LayerRequest, apply_pure
from query_gateway.rules.policy import check_available, check_layers_declared, check_policy, needs_caller
from query_gateway.rules.verdicts import (
    DataspaceRequest,
    Judged,
    column_checked,
    derived_plan,
    disclosure,
    judge,
    layer_requests,
)
from query_gateway.sql import (
    DEFAULT_LIMIT,
    ChangeOrder,
    ColumnTypes,
    Condition,
    GrowthRefused,
    LeakproofOperators,
    NarrowedQuery,
    Position,
    QueryPage,
    RangeCondition,
    ValidatedQuery,
    changes_statement,
    check_changes_statement,
    check_growth,
    check_narrowed,
    check_original,
    check_records_page,
    check_text,
    narrow_query,
    quoted,
    records_statement,
    shape_of,
    sql_shape,
)
from query_gateway.sql import validate_query as _validate_query
from query_gateway.state import Gateway

log = get_logger("query_gateway.query")
_QUERY_LOGGER = logging.getLogger("query_gateway.query")  # the stdlib logger `log` writes to

# what PostgreSQL's bigint takes: LIMIT and OFFSET are bound as bigint, and a value outside it is
# the caller's mistake (422 naming the field), not a failed query; inside it the clamping of QE-01
# still applies (limit <= 0 -> the default, above the cap -> the cap, a negative offset -> 0)
# Strict: JSON `true` is not the page size 1, nor `"5"` the page size 5 (issue 34): a value of
# another JSON type is the caller's mistake, 422 naming the field (QE-01)
BigInt = Annotated[StrictInt, Field(ge=-(2**63), le=2**63 - 1)]
LAYERS: tuple[Binds, Binds] = ("person", "organization")

# A statement this short is validated on the event loop: uncached, the worst shapes cost about
# 10 ms at this length (measured with sqlglot 30 on a loaded 2-core machine), and a cached one costs
# a dict look-up, cheaper than a thread hop. Longer ones are validated in a worker thread.
INLINE_SQL_CHARS = 1_024
# Two workers: a parse holds the GIL, so more threads would not parse faster, only take more of
# the interpreter from the event loop; a statement waiting for a worker costs no CPU meanwhile.
_VALIDATION_POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="sql-validate")
_T = TypeVar("_T")


class QueryBody(BaseModel):
    """`POST /query` (QE-01); the same body on `/dps/public/query` and `/query/plan`. A field
    it does not know is refused (422 naming it): `{"query": ...}` is a mistake, not a no-op."""

    model_config = ConfigDict(extra="forbid")

    sql: StrictStr | None = None
    limit: BigInt = DEFAULT_LIMIT
    offset: BigInt = 0
    skip_count: StrictBool = False


def page_body(page: QueryPage) -> dict[str, Any]:
    return {
        "items": page.items,
        "offset": page.offset,
        "limit": page.limit,
        "count": page.count,
        "total": page.total,
    }


# ---------------------------------------------------------------------- validate
async def _off_loop_if_long(text: str, work: Callable[..., _T], *args: Any) -> _T:
    """A short statement's work inline (a thread hop costs more than it does), a long one's in
    the worker pool."""
    if len(text) <= INLINE_SQL_CHARS:
        return work(*args)
    return await asyncio.get_running_loop().run_in_executor(_VALIDATION_POOL, work, *args)


def _admissible(gw: Gateway, sql: str | None) -> str:
    """The statement, refused before any parse when it is missing, longer than
    QUERY_MAX_SQL_CHARS, or holds text PostgreSQL cannot take (so it never reaches the
    parser, a log line, an error detail or the database)."""
    if sql is None or not sql.strip():
        raise ServiceError("sql_refused", "sql query not provided")
    limit = gw.settings.query_max_sql_chars
    if len(sql) > limit:
        raise ServiceError("sql_too_long", f"sql query longer than {limit} characters")
    check_text(sql)
    return sql


def _growth_verdict(q: ValidatedQuery, columns: ColumnTypes, max_value_bytes: int) -> str:
    try:
        check_growth(q, columns, max_value_bytes)
    except GrowthRefused as refused:
        return refused.detail
    return ""


async def _within_growth_budget(gw: Gateway, q: ValidatedQuery) -> None:
    """QE-11: no value of the statement can grow past the budget. The verdict is kept per text
    (read and written on the event loop only; the bound itself may be computed off it)."""
    verdict = gw.growth_verdicts.get(q.text)
    if verdict is None:
        max_bytes = gw.settings.query_max_value_bytes
        verdict = await _off_loop_if_long(q.text, _growth_verdict, q, gw.columns, max_bytes)
        gw.growth_verdicts.put(q.text, verdict)
    if verdict:
        raise GrowthRefused(verdict)


async def validate(gw: Gateway, sql: str | None, ctx: AccessContext) -> ValidatedQuery:
    """The admissible statement validated (parsed once: the tree is cached by text), a long
    one in a worker thread: a parse is pure CPU, and on the event loop it would stall every
    other request and the health probes meanwhile."""
    text = _admissible(gw, sql)
    q = await _off_loop_if_long(text, _validate_query, text, gw.catalogue)
    await _off_loop_if_long(text, check_original, q)  # QE-12: PostgreSQL's parser reads it alike
    await _within_growth_budget(gw, q)
    ctx.touching(list(q.dataset_ids))
    if _debug():
        log.debug("query_received", shape=shape_of(q.tree), datasets=list(q.dataset_ids))
    return q


# ---------------------------------------------------------------------- plan, narrow, execute
async def _resolved(
    gw: Gateway,
    entry: DatasetEntry,
    binds: Binds,
    req: LayerRequest,
    ctx: AccessContext,
    *,
    identity: CallerIdentity | None = None,
    ds_cache_ttl: int | None = None,
) -> Plan:
    """One layer's plan: a pure handler's applied here, any other's from the filter-resolver."""
    if req.handler in PURE_HANDLERS:
        return apply_pure(req)
    organizations = req.organizations
    claim = ClaimCheck(
        handler=req.handler,
        args=dict(req.args),
        table=entry.table,
        binds=binds,
        caller=identity,
        principals=req.principals,
        keys=req.keys,
        organizations=tuple(organizations)
        if organizations is not None
        else (identity.organizations if identity is not None else ()),
        ds_cache_ttl=ds_cache_ttl,
        request_context={"request_id": ctx.request_id},
    )
    return await gw.plans.resolve(claim)


async def _admit(gw: Gateway, kind: str, consumer: str | None, dataset_ids: Sequence[str]) -> None:
    """GS-14: one token from the consumer's bucket of every touched dataset, or the refusal."""
    if gw.limiter is not None:
        await gw.limiter.admit(kind, consumer, [gw.entries[d] for d in dataset_ids])


async def _planned(
    gw: Gateway,
    q: ValidatedQuery,
    ctx: AccessContext,
    plans_of: Callable[[DatasetEntry], Awaitable[list[Plan]]],
    leakproof: LeakproofOperators,
) -> NarrowedQuery:
    """Each touched dataset's plans (a refusal names that dataset), then the rewrite and its
    verification (cached per shape), off the loop for a long text."""
    plans: dict[str, list[Plan]] = {}
    for dataset_id in q.dataset_ids:
        ctx.judging(dataset_id)
        plans[dataset_id] = await plans_of(gw.entries[dataset_id])
    ctx.judging(None)
    return await _narrow(gw, q, plans, leakproof)


async def _narrow(
    gw: Gateway, q: ValidatedQuery, plans: Mapping[str, Sequence[Plan]], leakproof: LeakproofOperators
) -> NarrowedQuery:
    """`leakproof`: the operators a narrowing may go without its barrier under (none: every
    filtered narrowing is fenced)."""
    narrow = functools.partial(narrow_query, leakproof=leakproof)
    narrowed = await _off_loop_if_long(q.text, narrow, q, gw.catalogue, plans, gw.columns, gw.mask_key)
    await _off_loop_if_long(q.text, check_narrowed, narrowed)  # QE-12: and has the last word
    return narrowed


def row_cap(gw: Gateway, dataset_ids: Sequence[str]) -> int | None:
    """QE-07: the smallest `max_rows` of the touched datasets; None when none declares one."""
    caps = [cap for d in dataset_ids if (cap := gw.entries[d].max_rows) is not None]
    return min(caps) if caps else None


async def _execute(
    gw: Gateway, narrowed: NarrowedQuery, body: QueryBody, dataspace: bool, who: str
) -> QueryPage:
    """`who`: the consumer's kind-tagged identity, whose share of the pool the statement takes
    (QE-10), refused before a connection is asked for."""
    async with gw.slots.hold(who):
        return await _run_page(gw, narrowed, body, dataspace)


def consumer_key(kind: str, consumer: str | None) -> str:
    """One namespace per kind of identity (a user's `sub`, a client's id, a consumer DID), so an
    id of one kind never shares another's share; every anonymous caller shares one."""
    return f"{kind}\x00{consumer}" if consumer is not None else "anonymous"


def caller_identity(caller: Caller | None) -> tuple[str, str | None]:
    """A token's user (`sub`), else its client (a client-credentials token has no `sub`), each
    with its kind, so the two namespaces never meet (GS-14's buckets, QE-10's share)."""
    if caller is None:
        return "user", None
    if caller.sub:
        return "user", caller.sub
    return "client", caller.client_id


def caller_key(caller: Caller | None) -> str:
    return consumer_key(*caller_identity(caller))


async def _run_page(gw: Gateway, narrowed: NarrowedQuery, body: QueryBody, dataspace: bool) -> QueryPage:
    if dataspace:
        # RF-08: the predicate's values are the consenting subjects; even the shape stays out.
        # Guarded like the others: structlog runs its processors before stdlib drops the line
        if _debug():
            log.debug("narrowed_statement_withheld", reason="dataspace request")
    elif _debug():
        log.debug("narrowed_statement", shape=sql_shape(narrowed.sql), params=list(narrowed.param_labels))
    limit = body.limit if body.limit > 0 else DEFAULT_LIMIT
    return await gw.executor.run(
        narrowed,
        offset=max(0, body.offset),
        limit=limit,
        skip_count=body.skip_count,
        max_rows=row_cap(gw, [d.dataset_id for d in narrowed.exposure]),
    )


def _debug() -> bool:
    # isEnabledFor follows any later setLevel (the logging module clears its cache)
    return _QUERY_LOGGER.isEnabledFor(logging.DEBUG)


# ---------------------------------------------------------------------- the normal path
async def plan_normal(
    gw: Gateway, body: QueryBody, caller: Caller | None, ctx: AccessContext
) -> NarrowedQuery:
    """Everything up to the rewritten statement; every refusal is raised before any handler runs.
    Authentication comes first: without a bearer, when no dataset admits an anonymous caller,
    the answer is 401 whatever the statement says."""
    if caller is None and not gw.anonymous_readable:
        raise ServiceError(
            "auth_required", "authentication required: no dataset is open to anonymous callers"
        )
    q = await validate(gw, body.sql, ctx)
    for dataset_id in q.dataset_ids:
        entry = gw.entries[dataset_id]
        ctx.judging(entry.id)
        check_available(entry)
        if caller is None and needs_caller(entry):
            raise ServiceError("auth_required", f"Dataset {entry.id} requires authentication")
        if caller is not None:
            check_policy(entry, caller)
        if caller is None or not caller.platform_admin:
            check_layers_declared(entry)
    ctx.judging(None)
    # GS-14: after the policy (a refused caller takes no token), before any plan is resolved
    # (a token without `sub` is its client's, in a namespace of its own: a client id equal to a
    # user's `sub` takes from its own bucket); every anonymous caller shares one bucket
    kind, who = caller_identity(caller)
    await _admit(gw, kind, who, q.dataset_ids)
    identity = caller.identity() if caller is not None else None

    async def plans_of(entry: DatasetEntry) -> list[Plan]:
        if caller is not None and caller.platform_admin:
            return []  # docs/gateway.md: the platform-admin realm role skips row filters
        plans = []
        for layer in LAYERS:
            spec = getattr(entry.row_filters, layer)
            assert spec is not None  # check_layers_declared
            req = LayerRequest(dataset_id=entry.id, handler=spec.handler, args=spec.args, caller=caller)
            plans.append(await _resolved(gw, entry, layer, req, ctx, identity=identity))
        return plans

    return await _planned(gw, q, ctx, plans_of, gw.leakproof)


async def run_normal(
    gw: Gateway, body: QueryBody, caller: Caller | None, ctx: AccessContext
) -> dict[str, object]:
    narrowed = await plan_normal(gw, body, caller, ctx)
    page = await _execute(gw, narrowed, body, dataspace=False, who=caller_key(caller))
    ctx.succeeded()
    return page_body(page)


async def explain_normal(
    gw: Gateway, body: QueryBody, caller: Caller | None, ctx: AccessContext
) -> dict[str, object]:
    """`POST /query/plan`: the rewritten statement with each parameter labelled, never its values."""
    narrowed = await plan_normal(gw, body, caller, ctx)
    ctx.succeeded()
    return {
        "sql": narrowed.sql,
        "params": [{"param": f"${i}", "label": label} for i, label in enumerate(narrowed.param_labels, 1)],
        "denied": narrowed.denied,
        "exposure": {d.dataset_id: d.as_json() for d in narrowed.exposure},  # names and masks only
    }


# ---------------------------------------------------------------------- the dataspace paths
@dataclass(frozen=True)
class Granted:
    """A dataspace statement narrowed to what ds's verdict and the catalogue's layers permit,
    with what its disclosure record needs."""

    narrowed: NarrowedQuery
    judged: tuple[Judged, ...]
    decision_ref: str | None

    async def disclose(self, gw: Gateway, req: DataspaceRequest, rows: int) -> None:
        """RF-10: the disclosure of each touched dataset, durable before any row leaves."""
        await gw.disclosures.publish([disclosure(req, j, rows, self.decision_ref) for j in self.judged])


async def run_dataspace(
    gw: Gateway, body: QueryBody, req: DataspaceRequest, ctx: AccessContext
) -> dict[str, object]:
    ctx.as_consumer(req.consumer, req.agreement_id)
    q = await validate(gw, body.sql, ctx)
    granted = await narrow_for_dataspace(gw, q, req, ctx)
    page = await _execute(gw, granted.narrowed, body, dataspace=True, who=consumer_key("did", req.consumer))
    await granted.disclose(gw, req, page.count)
    ctx.succeeded()
    return page_body(page)


async def narrow_for_dataspace(
    gw: Gateway, q: ValidatedQuery, req: DataspaceRequest, ctx: AccessContext, *, fenced: bool = False
) -> Granted:
    """Every dataspace read's checks, in order: offered, ds's decision for every touched dataset
    (asked, or reused within its ttl), both layers judged, the expose gate, each layer's plan,
    and the statement narrowed by them. `fenced`: every filtered narrowing keeps its barrier,
    for a statement that will carry conditions of the gateway's own above it (a records page)."""
    entries = [gw.entries[d] for d in q.dataset_ids]
    unoffered = sorted(e.id for e in entries if not e.dataspace_expose)
    if unoffered:
        ctx.touching(unoffered)  # the record names only the offending datasets
        raise ServiceError("not_offered", f"Dataset not offered in the dataspace: {', '.join(unoffered)}")
    # GS-14: the verified consumer's buckets, before ds is asked (a consumer over its rate costs
    # the connector nothing)
    await _admit(gw, "did", req.consumer, q.dataset_ids)
    envelope = await gw.connector.authorize(
        req.connector_base,
        AuthorizeRequest(
            consumer_did=req.consumer,
            agreement_id=req.agreement_id,
            transfer_id=req.transfer_id,
            purpose=list(req.purpose),
            dataset_ids=list(q.dataset_ids),
        ),
    )
    ctx.decided(envelope.decision_ref)
    if not envelope.allowed:
        raise ServiceError("ds_refused", f"Refused by ds: {envelope.reason or 'denied'}")
    judged: dict[str, Judged] = {}
    for entry in entries:
        ctx.judging(entry.id)
        judged[entry.id] = judge(gw.catalogue, entry, envelope)
    for entry in entries:
        ctx.judging(entry.id)
        check_available(entry)  # the expose gate follows ds's decision
    ttl = envelope.cache.ttl_seconds if envelope.cache is not None else None

    async def layer_plan(j: Judged, layer: Binds, req: LayerRequest, from_ds: bool) -> Plan:
        """A pure handler's plan derived once per verdict, any other resolved; `from_ds`: the
        filter (and so its column) came from ds's verdict, checked against the table."""

        def checked(plan: Plan) -> Plan:
            return column_checked(gw.columns.get(j.entry.table, {}), j, plan) if from_ds else plan

        if req.handler in PURE_HANDLERS:
            return derived_plan(j, layer, lambda: checked(apply_pure(req)))
        return checked(await _resolved(gw, j.entry, layer, req, ctx, ds_cache_ttl=ttl))

    async def plans_of(entry: DatasetEntry) -> list[Plan]:
        j = judged[entry.id]
        person, organization = layer_requests(j)
        return [
            # no person-layer filter from ds: the catalogue's person layer is allow_all (judged)
            Plan.allow_all() if person is None else await layer_plan(j, "person", person, True),
            await layer_plan(j, "organization", organization, False),
        ]

    narrowed = await _planned(gw, q, ctx, plans_of, frozenset() if fenced else gw.leakproof)
    return Granted(narrowed, tuple(judged.values()), envelope.decision_ref)


# ---------------------------------------------------------------------- the records path
@dataclass(frozen=True)
class RecordsAsk:
    """What one records page asks (docs/records.md): the client filters as conditions, the
    record key with its column types, the cursor's key (None: the first page), the page size."""

    conditions: tuple[Condition, ...]
    key: tuple[tuple[str, str], ...]
    after: tuple[str, ...] | None
    limit: int


async def read_dataset(
    gw: Gateway, dataset_id: str, req: DataspaceRequest, ctx: AccessContext, *, fenced: bool
) -> Granted:
    """The flow's dataset whole, read as `/dps/public/query` reads a statement: validated, judged
    and narrowed (`fenced`: wherever the records path adds conditions above it, since they are
    not the leakproof judgement's to pass)."""
    whole = f"SELECT * FROM {quoted(dataset_id)}"  # noqa: S608 - a quoted identifier
    q = await validate(gw, whole, ctx)
    return await narrow_for_dataspace(gw, q, req, ctx, fenced=fenced)


async def _run_records(gw: Gateway, statement: NarrowedQuery, req: DataspaceRequest, rows: int) -> QueryPage:
    """A verified records statement run within the consumer's share (QE-10), `rows` at most."""
    if _debug():
        log.debug("narrowed_statement_withheld", reason="dataspace request")  # RF-08, as _run_page
    async with gw.slots.hold(consumer_key("did", req.consumer)):
        return await gw.executor.run(statement, offset=0, limit=rows, skip_count=True)


async def read_records(
    gw: Gateway, dataset_id: str, ask: RecordsAsk, req: DataspaceRequest, ctx: AccessContext
) -> tuple[QueryPage, Granted]:
    """A records page over the flow's dataset read whole (`read_dataset`), the page's statement
    built in `sql/` over the narrowed one and verified (QE-12), and run within the consumer's
    share (QE-10). One row more than the page is asked for: it says whether another page
    follows. The caller discloses."""
    fenced = bool(ask.conditions) or ask.after is not None
    granted = await read_dataset(gw, dataset_id, req, ctx, fenced=fenced)
    page = records_statement(granted.narrowed, ask.conditions, ask.key, ask.after)
    check_records_page(page)
    return await _run_records(gw, page.statement, req, ask.limit + 1), granted


@dataclass(frozen=True)
class ChangesAsk:
    """What one change session answer reads (docs/records.md, "Change sessions"): the dataset's
    change order, the client filters, where the session stands, and how many rows at most."""

    order: ChangeOrder
    conditions: tuple[RangeCondition, ...]
    position: Position
    rows: int


async def read_changes(gw: Gateway, granted: Granted, ask: ChangesAsk, req: DataspaceRequest) -> QueryPage:
    """A change session's rows over the flow's dataset read whole (`read_dataset`, always
    fenced: the join and the conditions sit above it): the session's statement built in `sql/`
    over the narrowed one and verified (QE-12), and run within the consumer's share (QE-10).
    Apart from the read, so that the caller can judge its token against the narrowed statement
    first (a resync is answered before anything runs)."""
    read = changes_statement(granted.narrowed, ask.order, ask.conditions, ask.position, ask.rows)
    check_changes_statement(read)
    return await _run_records(gw, read.statement, req, ask.rows)
