"""The gateway's runtime state and what both paths share: the request body, plan resolution for
one layer (pure in-process, lookups through the filter-resolver), and execution."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from dataplane_contracts.catalogue import PURE_HANDLERS, Binds, Catalogue, DatasetEntry
from dataplane_contracts.ds import Organization
from dataplane_contracts.plans import CallerIdentity, ClaimCheck, Plan
from dataplane_service_kit.errors import ServiceError
from dataplane_service_kit.logs import get_logger
from query_gateway.access_log import AccessContext
from query_gateway.clients.connector import ConnectorClient
from query_gateway.clients.disclosure import DisclosurePublisher
from query_gateway.clients.identity import OidcVerifier
from query_gateway.clients.plan_client import PlanClient
from query_gateway.clients.pull import PullVerifier
from query_gateway.clients.rate_limit import RateLimiter
from query_gateway.rules.layers import LayerRequest, apply_pure
from query_gateway.rules.policy import needs_caller
from query_gateway.settings import GatewaySettings
from query_gateway.sql import (
    DEFAULT_LIMIT,
    ColumnTypes,
    NarrowedQuery,
    QueryExecutor,
    QueryPage,
    ValidatedQuery,
    narrow_query,
    sql_shape,
    validate_query,
)
from query_gateway.sql.execute import check_text
from query_gateway.sql.exposure import MaskKey
from query_gateway.sql.shape import shape_of

log = get_logger("query_gateway.query")

# what PostgreSQL's bigint takes: LIMIT and OFFSET are bound as bigint, and a value outside it is
# the caller's mistake (422 naming the field), not a failed query; inside it the clamping of QE-01
# still applies (limit <= 0 -> the default, above the cap -> the cap, a negative offset -> 0)
BigInt = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]

# A statement this short is validated on the event loop: uncached, the worst shapes cost about
# 10 ms at this length (measured with sqlglot 30 on a loaded 2-core machine), and a cached one costs
# a dict look-up, cheaper than a thread hop. Longer ones are validated in a worker thread.
INLINE_SQL_CHARS = 1_024
# Two workers: a parse holds the GIL, so more threads would not parse faster, only take more of
# the interpreter from the event loop; a statement waiting for a worker costs no CPU meanwhile.
_VALIDATION_POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="sql-validate")
_T = TypeVar("_T")


async def _off_loop_if_long(text: str, work: Callable[..., _T], *args: Any) -> _T:
    """A short statement's work inline (a thread hop costs more than it does), a long one's in
    the worker pool."""
    if len(text) <= INLINE_SQL_CHARS:
        return work(*args)
    return await asyncio.get_running_loop().run_in_executor(_VALIDATION_POOL, work, *args)


class QueryBody(BaseModel):
    """`POST /query` (QE-01); the same body on `/dps/public/query` and `/query/plan`. A field
    it does not know is refused (422 naming it): `{"query": ...}` is a mistake, not a no-op."""

    model_config = ConfigDict(extra="forbid")

    sql: str | None = None
    limit: BigInt = DEFAULT_LIMIT
    offset: BigInt = 0
    skip_count: bool = False


def page_body(page: QueryPage) -> dict[str, Any]:
    return {
        "items": page.items,
        "offset": page.offset,
        "limit": page.limit,
        "count": page.count,
        "total": page.total,
    }


@dataclass
class Gateway:
    settings: GatewaySettings
    catalogue: Catalogue
    columns: ColumnTypes
    executor: QueryExecutor
    plans: PlanClient
    oidc: OidcVerifier
    connector: ConnectorClient
    disclosures: DisclosurePublisher
    pull: PullVerifier | None = None
    mask_key: MaskKey | None = None  # COLUMN_MASK_KEY, for the catalogue's `hash` column masks
    limiter: RateLimiter | None = None  # GS-14: the consumers' buckets (None: nothing limited)
    entries: dict[str, DatasetEntry] = field(default_factory=dict)
    # some dataset can be read without a bearer: else an anonymous request is refused 401 before
    # its statement is parsed (what the statement says is no business of an anonymous caller)
    anonymous_readable: bool = False

    def __post_init__(self) -> None:
        self.entries = self.catalogue.by_id()
        self.anonymous_readable = any(
            entry.expose and entry.access_level != "secret" and not needs_caller(entry)
            for entry in self.catalogue.datasets
        )

    # ------------------------------------------------------------------ statement
    def admissible(self, body: QueryBody) -> str:
        """The statement, refused before any parse when it is missing, longer than
        QUERY_MAX_SQL_CHARS, or holds text PostgreSQL cannot take (so it never reaches the
        parser, a log line, an error detail or the database)."""
        sql = body.sql
        if sql is None or not sql.strip():
            raise ServiceError("sql_refused", "sql query not provided")
        limit = self.settings.query_max_sql_chars
        if len(sql) > limit:
            raise ServiceError("sql_too_long", f"sql query longer than {limit} characters")
        check_text(sql)
        return sql

    async def validate_async(self, body: QueryBody, ctx: AccessContext) -> ValidatedQuery:
        """The admissible statement validated (parsed once: the tree is cached by text), a long
        one in a worker thread: a parse is pure CPU, and on the event loop it would stall every
        other request and the health probes meanwhile."""
        sql = self.admissible(body)
        q = await _off_loop_if_long(sql, validate_query, sql, self.catalogue)
        ctx.touched = list(q.dataset_ids)
        if _debug():
            log.debug("query received", shape=shape_of(q.tree), datasets=list(q.dataset_ids))
        return q

    # ------------------------------------------------------------------ plans
    async def layer_plan(
        self,
        entry: DatasetEntry,
        binds: Binds,
        req: LayerRequest,
        ctx: AccessContext,
        *,
        identity: CallerIdentity | None = None,
        ds_cache_ttl: int | None = None,
    ) -> Plan:
        """A pure handler is applied here; any other goes to the filter-resolver."""
        if req.handler in PURE_HANDLERS:
            return apply_pure(req)
        claim = ClaimCheck(
            handler=req.handler,
            args=dict(req.args),
            table=entry.table,
            binds=binds,
            caller=identity,
            principals=req.principals,
            keys=req.keys,
            organizations=tuple(req.organizations) if req.organizations is not None else _orgs(identity),
            ds_cache_ttl=ds_cache_ttl,
            request_context={"request_id": ctx.request_id},
        )
        return await self.plans.resolve(claim)

    # ------------------------------------------------------------------ admission
    async def admit(self, kind: str, consumer: str | None, dataset_ids: Sequence[str]) -> None:
        """GS-14: one token from the consumer's bucket of every touched dataset, or the refusal."""
        if self.limiter is not None:
            await self.limiter.admit(kind, consumer, [self.entries[d] for d in dataset_ids])

    def row_cap(self, dataset_ids: Sequence[str]) -> int | None:
        """QE-07: the smallest `max_rows` of the touched datasets; None when none declares one."""
        caps = [cap for d in dataset_ids if (cap := self.entries[d].max_rows) is not None]
        return min(caps) if caps else None

    # ------------------------------------------------------------------ execution
    async def narrow(self, q: ValidatedQuery, plans: Mapping[str, Sequence[Plan]]) -> NarrowedQuery:
        """The rewrite and its verification (cached per shape), off the loop for a long text."""
        return await _off_loop_if_long(
            q.text, narrow_query, q, self.catalogue, plans, self.columns, self.mask_key
        )

    async def execute(self, narrowed: NarrowedQuery, body: QueryBody, dataspace: bool) -> QueryPage:
        if dataspace:
            # RF-08: the predicate's values are the consenting subjects; even the shape stays out.
            # Guarded like the others: structlog runs its processors before stdlib drops the line
            if _debug():
                log.debug("narrowed statement withheld on a dataspace request")
        elif _debug():
            log.debug("narrowed statement", shape=sql_shape(narrowed.sql), params=list(narrowed.param_labels))
        limit = body.limit if body.limit > 0 else DEFAULT_LIMIT
        return await self.executor.run(
            narrowed,
            offset=max(0, body.offset),
            limit=limit,
            skip_count=body.skip_count,
            max_rows=self.row_cap([d.dataset_id for d in narrowed.exposure]),
        )


_QUERY_LOGGER = logging.getLogger("query_gateway.query")  # the stdlib logger `log` writes to


def _debug() -> bool:
    # isEnabledFor follows any later setLevel (the logging module clears its cache)
    return _QUERY_LOGGER.isEnabledFor(logging.DEBUG)


def _orgs(identity: CallerIdentity | None) -> tuple[Organization, ...]:
    return identity.organizations if identity is not None else ()
