"""The dataspace paths (legacy EDR and DPS pull): the `dataspace_expose` gate, one ds decision for
every touched dataset, the verdict's filter as the person layer (RF-01, RF-02, RF-06), the
catalogue's organization layer on the consumer's organizations (GS-13), the expose gate, and the
disclosure record before any row leaves (RF-10)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pydantic import ValidationError

from dataplane_contracts.catalogue import PURE_HANDLERS, REFUSES_DELEGATION, Binds, DatasetEntry
from dataplane_contracts.ds import AuthorizeRequest, DataplaneRowFilter, DatasetVerdict, DecisionEnvelope
from dataplane_contracts.events import DisclosureRecorded
from dataplane_contracts.plans import Plan
from dataplane_service_kit.errors import ServiceError
from query_gateway.access_log import AccessContext
from query_gateway.gateway import Gateway, QueryBody, page_body
from query_gateway.rules.layers import LayerRequest, apply_pure
from query_gateway.rules.policy import check_available, is_allow_all
from query_gateway.sql import NarrowedQuery, ValidatedQuery


@dataclass(frozen=True)
class DataspaceRequest:
    consumer: str
    provider: str | None
    connector_base: str
    agreement_id: str
    transfer_id: str | None
    purpose: tuple[str, ...]


def parse_purpose(header: str | None) -> tuple[str, ...]:
    """`Edc-Purpose`: comma-separated, trimmed, empties dropped."""
    return tuple(p.strip() for p in (header or "").split(",") if p.strip())


def _unenforceable(handler: str, dataset_id: str, why: str) -> ServiceError:
    return ServiceError(
        "row_filter_unenforceable",
        f"Cannot enforce row filter handler '{handler}' for {dataset_id}: {why}; no rows may be served",
    )


@dataclass(frozen=True)
class _Judged:
    entry: DatasetEntry
    verdict: DatasetVerdict
    person_filter: DataplaneRowFilter | None  # None: no person-layer filter from ds


def _unreadable(dataset_id: str, why: str) -> ServiceError:
    # the detail names the dataset only: the filter's values are personal data (RF-08)
    return ServiceError("row_filter_unreadable", f"ds-connector {why} for {dataset_id}")


def _judge(gw: Gateway, entry: DatasetEntry, envelope: DecisionEnvelope) -> _Judged:
    verdicts = [v for v in envelope.datasets if v.dataset_id == entry.id]
    if not verdicts:
        raise ServiceError("ds_refused", f"Refused by ds: no verdict for {entry.id}")
    if len(verdicts) > 1:
        # two answers to one question: the two ends disagree, so neither is served
        raise _unreadable(entry.id, "sent more than one verdict")
    verdict = verdicts[0]
    if verdict.decision != "allow":
        raise ServiceError("ds_refused", f"Refused by ds: {verdict.reason or 'denied'} ({entry.id})")
    try:
        row_filter = verdict.parse_row_filter()  # RF-02: strict, touched datasets only
    except ValidationError:
        raise _unreadable(entry.id, "sent a row filter this data plane cannot apply") from None
    person_filter = None
    if row_filter is not None and row_filter.handler == "allow_all":
        # allow_all names no subjects and no layer: it is read as no person-layer filter, so the
        # catalogue's own person layer must admit every row (below) — never as "every row"
        row_filter = None
    if row_filter is not None:
        binds = gw.catalogue.binds_of(row_filter.handler)
        if binds == "unknown":
            raise _unenforceable(row_filter.handler, entry.id, "unknown handler")
        if binds == "organization":
            # ds's copy for a dataset that is not consent-gated: not the person layer (RF-01)
            if row_filter.principals or row_filter.keys or row_filter.subject_dids:
                raise _unenforceable(row_filter.handler, entry.id, "it refuses delegation")
        else:
            if row_filter.handler in REFUSES_DELEGATION:
                raise _unenforceable(row_filter.handler, entry.id, "it refuses delegation")
            person_filter = row_filter
    layers = entry.row_filters
    if person_filter is None and not is_allow_all(layers.person):
        raise ServiceError(
            "row_policy_denied",
            f"dataset {entry.id}: no person-layer filter and the person layer is not allow_all",
        )
    for name, spec in (("person", layers.person), ("organization", layers.organization)):
        if spec is None or spec.handler == "deny_all":
            raise ServiceError("row_policy_denied", f"dataset {entry.id}: the {name} layer admits no rows")
    return _Judged(entry, verdict, person_filter)


async def run_dataspace(
    gw: Gateway, body: QueryBody, req: DataspaceRequest, ctx: AccessContext
) -> dict[str, object]:
    ctx.sub = ctx.client_id = req.consumer
    ctx.agreement_id = req.agreement_id
    q = await gw.validate_async(body, ctx)
    granted = await narrow_for_dataspace(gw, q, req, ctx)
    page = await gw.execute(granted.narrowed, body, dataspace=True)
    await granted.disclose(gw, req, page.count)
    ctx.succeeded()
    return page_body(page)


@dataclass(frozen=True)
class Granted:
    """A dataspace statement narrowed to what ds's verdict and the catalogue's layers permit,
    with what its disclosure record needs."""

    narrowed: NarrowedQuery
    judged: tuple[_Judged, ...]
    decision_ref: str | None

    async def disclose(self, gw: Gateway, req: DataspaceRequest, rows: int) -> None:
        """RF-10: the disclosure of each touched dataset, durable before any row leaves."""
        events = [_disclosure(req, j, rows, self.decision_ref) for j in self.judged]
        await gw.disclosures.publish(events)


async def narrow_for_dataspace(
    gw: Gateway, q: ValidatedQuery, req: DataspaceRequest, ctx: AccessContext
) -> Granted:
    """Every dataspace read's checks, in order: offered, ds's decision for every touched dataset
    (asked, or reused within its ttl), both layers judged, the expose gate, each layer's plan,
    and the statement narrowed by them."""
    entries = [gw.entries[d] for d in q.dataset_ids]
    unoffered = sorted(e.id for e in entries if not e.dataspace_expose)
    if unoffered:
        ctx.touched = unoffered  # the record names only the offending datasets
        raise ServiceError("not_offered", f"Dataset not offered in the dataspace: {', '.join(unoffered)}")
    # GS-14: the verified consumer's buckets, before ds is asked (a consumer over its rate costs
    # the connector nothing)
    await gw.admit("did", req.consumer, q.dataset_ids)
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
    ctx.decision_ref = envelope.decision_ref
    if not envelope.allowed:
        raise ServiceError("ds_refused", f"Refused by ds: {envelope.reason or 'denied'}")
    judged = []
    for entry in entries:
        ctx.current = entry.id
        judged.append(_judge(gw, entry, envelope))
    for j in judged:
        ctx.current = j.entry.id
        check_available(j.entry)  # the expose gate follows ds's decision
    ttl = envelope.cache.ttl_seconds if envelope.cache is not None else None
    plans: dict[str, list[Plan]] = {}
    for j in judged:
        ctx.current = j.entry.id
        plans[j.entry.id] = [await _person_plan(gw, j, ctx, ttl), await _organization_plan(gw, j, ctx, ttl)]
    ctx.current = None
    return Granted(await gw.narrow(q, plans), tuple(judged), envelope.decision_ref)


def _disclosure(req: DataspaceRequest, j: _Judged, rows: int, decision_ref: str | None) -> DisclosureRecorded:
    """RF-10's record of this dataset's disclosure, every field validated. The subject DIDs are
    the strictly parsed filter's (`DataplaneRowFilter.subject_dids`, the same `list[Did]` type as
    the event's field): validated once per verdict there, they are not validated again per
    request here — a hundred pattern checks that cannot fail."""
    event = DisclosureRecorded(
        provider_participant=req.provider,
        consumer_id=req.consumer,
        agreement_id=req.agreement_id,
        transfer_id=req.transfer_id,
        dataset_id=j.entry.id,
        row_count=rows,
        decision_ref=decision_ref,
        authorized_subject_ids=None,
    )
    if j.person_filter is None:
        return event
    return event.model_copy(update={"authorized_subject_ids": list(j.person_filter.subject_dids)})


def _derived_plan(j: _Judged, layer: str, build: Callable[[], Plan]) -> Plan:
    """A pure handler's plan from this verdict, built once while ds's decision is reused: it is
    a function of the verdict and the catalogue entry alone (the entry compared by identity, so a
    catalogue read again never meets an old plan). Refusals are not kept: raised every time."""
    memo = j.verdict.derived()
    kept = memo.get(layer)
    if isinstance(kept, tuple) and kept[0] is j.entry:
        plan: Plan = kept[1]
        return plan
    plan = build()
    memo[layer] = (j.entry, plan)
    return plan


async def _person_plan(gw: Gateway, j: _Judged, ctx: AccessContext, ttl: int | None) -> Plan:
    f = j.person_filter
    if f is None:
        return Plan.allow_all()  # the catalogue's person layer is allow_all (checked)
    req = LayerRequest(
        dataset_id=j.entry.id,
        handler=f.handler,
        args=f.args,
        caller=None,
        principals=tuple(f.principals),  # delegated, even when empty (RF-05)
        keys=tuple(f.keys),
    )
    return await _layer_plan(gw, j, "person", req, ctx=ctx, ttl=ttl, from_ds=True)


def _checked(gw: Gateway, j: _Judged, plan: Plan) -> Plan:
    if plan.column is not None and plan.column not in gw.columns.get(j.entry.table, {}):
        # the column came from ds's filter, not from the consumer: ds and catalogue disagree
        raise _unreadable(j.entry.id, "sent a row filter naming a column the dataset does not have")
    return plan


async def _organization_plan(gw: Gateway, j: _Judged, ctx: AccessContext, ttl: int | None) -> Plan:
    spec = j.entry.row_filters.organization
    assert spec is not None  # _judge
    req = LayerRequest(
        dataset_id=j.entry.id,
        handler=spec.handler,
        args=spec.args,
        caller=None,
        organizations=tuple(j.verdict.organizations or ()),  # none → no rows (GS-13)
    )
    return await _layer_plan(gw, j, "organization", req, ctx=ctx, ttl=ttl, from_ds=False)


async def _layer_plan(
    gw: Gateway,
    j: _Judged,
    layer: Binds,
    req: LayerRequest,
    *,
    ctx: AccessContext,
    ttl: int | None,
    from_ds: bool,
) -> Plan:
    """One layer's plan: a pure handler's derived once per verdict, any other resolved. `from_ds`:
    the filter (and so its column) came from ds's verdict, checked against the table."""

    def checked(plan: Plan) -> Plan:
        return _checked(gw, j, plan) if from_ds else plan

    if req.handler in PURE_HANDLERS:
        return _derived_plan(j, layer, lambda: checked(apply_pure(req)))
    return checked(await gw.layer_plan(j.entry, layer, req, ctx, ds_cache_ttl=ttl))
