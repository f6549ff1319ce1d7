"""The ds connector as the data plane sees it (docs/wire-contracts.md; RF-01, RF-02, RF-10).

The envelope is read leniently: its fields are not narrowings. Each verdict's `row_filter` is
kept raw and parsed strictly (`DataplaneRowFilter`) only for the datasets a query touches, so a
filter for another dataset cannot refuse a query that is otherwise fine."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    PrivateAttr,
    StrictInt,
    StrictStr,
    field_validator,
)

from dataplane_contracts.base import ContractModel, TolerantModel

DID_RE = re.compile(r"^did:[a-z0-9]+:[A-Za-z0-9._:%-]+(?:[/?#].*)?$")


def is_did(value: object) -> bool:
    return isinstance(value, str) and DID_RE.fullmatch(value) is not None


def _check_did(value: str) -> str:
    if not is_did(value):
        # the offending value is not echoed: it may be personal data (an email, a username)
        raise ValueError("subject_dids entries must be DIDs")
    return value


Did = Annotated[StrictStr, AfterValidator(_check_did)]


class DataplaneRowFilter(ContractModel):
    """The filter travels whole (RF-01); unknown fields refuse (RF-02); only `handler` is required,
    so an older connector still parses (RF-02, RF-10)."""

    handler: Annotated[StrictStr, Field(min_length=1)]
    args: dict[str, Any] = Field(default_factory=dict)
    # repr=False as well as the __repr__ below: pydantic's other renderings (rich, devtools) read
    # the field list, not __repr__
    principals: list[StrictStr] = Field(default_factory=list, repr=False)
    keys: list[StrictStr] = Field(default_factory=list, repr=False)
    subject_dids: list[Did] = Field(default_factory=list)

    def __repr__(self) -> str:
        # principals and keys are personal data; a repr must never carry them
        return (
            f"DataplaneRowFilter(handler={self.handler!r}, args=<{len(self.args)}>, "
            f"principals=<{len(self.principals)}>, keys=<{len(self.keys)}>, "
            f"subject_dids=<{len(self.subject_dids)}>)"
        )

    __str__ = __repr__


class Organization(ContractModel):
    """One consumer organization: an alias and its types."""

    alias: StrictStr
    types: tuple[StrictStr, ...] = ()


def _read_organizations(raw: object) -> list[Organization]:
    """Lenient: a list of alias strings, or objects with `alias` (or `id`) and `type`/`types`.
    Entries that name no alias are skipped; anything that is not a list reads as none."""
    if not isinstance(raw, list):
        return []
    out: list[Organization] = []
    for entry in raw:
        if isinstance(entry, str) and entry:
            out.append(Organization(alias=entry))
        elif isinstance(entry, dict):
            alias = entry.get("alias") or entry.get("id")
            if not isinstance(alias, str) or not alias:
                continue
            types_raw = entry.get("types", entry.get("type", []))
            if isinstance(types_raw, str):
                types_raw = [types_raw]
            types = tuple(t for t in types_raw if isinstance(t, str)) if isinstance(types_raw, list) else ()
            out.append(Organization(alias=alias, types=types))
    return out


Organizations = Annotated[list[Organization], BeforeValidator(_read_organizations)]


class DatasetVerdict(TolerantModel):
    dataset_id: StrictStr
    decision: StrictStr | None = None
    reason: StrictStr | None = None
    # raw: parsed strictly only for touched datasets (RF-02). Unparsed, it has no redacting repr
    # of its own, and it carries principals and keys: it is left out of this model's repr (RF-08).
    row_filter: Any = Field(default=None, repr=False)
    organizations: Organizations | None = None
    # the strict parse, kept: a verdict reused for its ttl (the gateway's decision cache) is
    # parsed once, not once per request — a hundred DIDs checked against a pattern each time
    _parsed: DataplaneRowFilter | None = PrivateAttr(default=None)

    def parse_row_filter(self) -> DataplaneRowFilter | None:
        """Strict parse; raises pydantic.ValidationError for an unreadable filter (each time:
        only a readable filter is kept)."""
        if self.row_filter is None:
            return None
        if self._parsed is None:
            # the model is frozen, its private attributes are not; the raw filter never changes
            self._parsed = DataplaneRowFilter.model_validate(self.row_filter)
        return self._parsed


class DecisionCache(TolerantModel):
    ttl_seconds: StrictInt | None = None


def _lenient_list(raw: object) -> list[Any]:
    return raw if isinstance(raw, list) else []


class DecisionEnvelope(TolerantModel):
    """`POST /internal/dataplane/authorize` answer, read leniently."""

    decision: StrictStr
    reason: StrictStr | None = None
    detail: StrictStr | None = None
    agreement_id: StrictStr | None = None
    transfer_id: StrictStr | None = None
    datasets: Annotated[list[DatasetVerdict], BeforeValidator(_lenient_list)] = Field(default_factory=list)
    cache: DecisionCache | None = None
    decision_ref: StrictStr | None = None

    @field_validator("decision_ref", mode="before")
    @classmethod
    def _keep_non_empty(cls, v: object) -> object:
        return v if isinstance(v, str) and v else None

    @property
    def allowed(self) -> bool:
        return self.decision == "allow"

    def verdict_for(self, dataset_id: str) -> DatasetVerdict | None:
        for verdict in self.datasets:
            if verdict.dataset_id == dataset_id:
                return verdict
        return None


class AuthorizeRequest(ContractModel):
    """`POST /internal/dataplane/authorize` body: one call for every dataset the statement touches."""

    consumer_did: StrictStr
    agreement_id: StrictStr
    transfer_id: StrictStr | None = None
    purpose: list[StrictStr] = Field(default_factory=list)
    dataset_ids: list[StrictStr]


class AuditQueryBody(ContractModel):
    """`POST /internal/audit/query` body (QueryExecuted). `authorized_subject_ids` is the person
    filter's subject_dids, `null` when ds sent no person-layer filter (RF-10); `decision_ref` is
    sent only when present, never as null (serialise with exclude_none on that field)."""

    dataset_id: StrictStr
    consumer_id: StrictStr
    user_id: None = None
    subject_id: None = None
    agreement_id: StrictStr
    transfer_id: StrictStr | None = None
    row_count: StrictInt
    authorized_subject_ids: list[Did] | None
    decision_ref: StrictStr | None = None

    def wire(self) -> dict[str, Any]:
        body = self.model_dump(mode="json")
        if body.get("decision_ref") is None:
            body.pop("decision_ref", None)
        return body
