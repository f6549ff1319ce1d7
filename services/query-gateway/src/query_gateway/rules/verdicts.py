"""ds's decision judged for one dataset, without I/O: the verdict (RF-01, RF-02, RF-06), the
catalogue's two layers it must meet, each layer's request, and RF-10's disclosure record."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Container
from dataclasses import dataclass

from pydantic import ValidationError

from dataplane_contracts.catalogue import REFUSES_DELEGATION, Binds, Catalogue, DatasetEntry
from dataplane_contracts.ds import DataplaneRowFilter, DatasetVerdict, DecisionEnvelope
from dataplane_contracts.events import DisclosureRecorded
from dataplane_contracts.plans import Plan
from dataplane_service_kit.errors import ServiceError
from query_gateway.rules.layers import LayerRequest
from query_gateway.rules.policy import is_allow_all


@dataclass(frozen=True)
class DataspaceRequest:
    """What a dataspace request says about itself, once its token verified."""

    consumer: str
    provider: str | None
    connector_base: str
    agreement_id: str
    transfer_id: str | None
    purpose: tuple[str, ...]


def parse_purpose(header: str | None) -> tuple[str, ...]:
    """`Edc-Purpose`: comma-separated, trimmed, empties dropped."""
    return tuple(p.strip() for p in (header or "").split(",") if p.strip())


@dataclass(frozen=True)
class Judged:
    entry: DatasetEntry
    verdict: DatasetVerdict
    person_filter: DataplaneRowFilter | None  # None: no person-layer filter from ds


def unreadable(dataset_id: str, why: str) -> ServiceError:
    # the detail names the dataset only: the filter's values are personal data (RF-08)
    return ServiceError("row_filter_unreadable", f"ds-connector {why} for {dataset_id}")


def _unenforceable(handler: str, dataset_id: str, why: str) -> ServiceError:
    return ServiceError(
        "row_filter_unenforceable",
        f"Cannot enforce row filter handler '{handler}' for {dataset_id}: {why}; no rows may be served",
    )


def judge(catalogue: Catalogue, entry: DatasetEntry, envelope: DecisionEnvelope) -> Judged:
    """The dataset's verdict read strictly, and the layers it leaves the catalogue to apply."""
    verdicts = [v for v in envelope.datasets if v.dataset_id == entry.id]
    if not verdicts:
        raise ServiceError("ds_refused", f"Refused by ds: no verdict for {entry.id}")
    if len(verdicts) > 1:
        # two answers to one question: the two ends disagree, so neither is served
        raise unreadable(entry.id, "sent more than one verdict")
    verdict = verdicts[0]
    if verdict.decision != "allow":
        raise ServiceError("ds_refused", f"Refused by ds: {verdict.reason or 'denied'} ({entry.id})")
    try:
        row_filter = verdict.parse_row_filter()  # RF-02: strict, touched datasets only
    except ValidationError:
        raise unreadable(entry.id, "sent a row filter this data plane cannot apply") from None
    person_filter = None
    if row_filter is not None and row_filter.handler == "allow_all":
        # allow_all names no subjects and no layer: it is read as no person-layer filter, so the
        # catalogue's own person layer must admit every row (below) — never as "every row"
        row_filter = None
    if row_filter is not None:
        binds = catalogue.binds_of(row_filter.handler)
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
    return Judged(entry, verdict, person_filter)


def layer_requests(j: Judged) -> tuple[LayerRequest | None, LayerRequest]:
    """The person layer's request (None: the catalogue's person layer is allow_all, checked by
    `judge`) and the organization layer's, on the consumer's organizations (GS-13)."""
    f = j.person_filter
    person = (
        None
        if f is None
        else LayerRequest(
            dataset_id=j.entry.id,
            handler=f.handler,
            args=f.args,
            caller=None,
            principals=tuple(f.principals),  # delegated, even when empty (RF-05)
            keys=tuple(f.keys),
        )
    )
    spec = j.entry.row_filters.organization
    assert spec is not None  # judge
    organization = LayerRequest(
        dataset_id=j.entry.id,
        handler=spec.handler,
        args=spec.args,
        caller=None,
        organizations=tuple(j.verdict.organizations or ()),  # none → no rows (GS-13)
    )
    return person, organization


# The plans of pure handlers derived from one verdict object, by layer: gateway state kept beside
# the wire model, not in it. An entry lives exactly as long as its verdict does (the decision cache
# holds the envelope for ds's ttl): a finalizer drops it when the verdict is collected, before its
# id can name another object. Read and written on the event loop only.
_Derived = dict[Binds, tuple[DatasetEntry, Plan]]
_derived: dict[int, _Derived] = {}


def _derived_of(verdict: DatasetVerdict) -> _Derived:
    key = id(verdict)
    memo = _derived.get(key)
    if memo is None:
        memo = _derived[key] = {}
        weakref.finalize(verdict, _derived.pop, key, None)
    return memo


def derived_plan(j: Judged, layer: Binds, build: Callable[[], Plan]) -> Plan:
    """A pure handler's plan from this verdict, built once while ds's decision is reused: it is
    a function of the verdict and the catalogue entry alone (the entry compared by identity, so a
    catalogue read again never meets an old plan). Refusals are not kept: raised every time."""
    memo = _derived_of(j.verdict)
    kept = memo.get(layer)
    if kept is not None and kept[0] is j.entry:
        return kept[1]
    plan = build()
    memo[layer] = (j.entry, plan)
    return plan


def column_checked(table_columns: Container[str], j: Judged, plan: Plan) -> Plan:
    """A plan built from ds's filter names a column the table has, or nothing is served."""
    if plan.column is not None and plan.column not in table_columns:
        # the column came from ds's filter, not from the consumer: ds and catalogue disagree
        raise unreadable(j.entry.id, "sent a row filter naming a column the dataset does not have")
    return plan


def disclosure(req: DataspaceRequest, j: Judged, rows: int, decision_ref: str | None) -> DisclosureRecorded:
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
