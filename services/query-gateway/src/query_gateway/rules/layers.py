"""The apply phase of the pure built-in handlers (docs/row-filters.md, "Two phases"): pure functions of
the filter and the caller, evaluated in-process so a consumer's keys never leave the gateway
except as a bound SQL parameter. RF-04, RF-05, GS-06, GS-07, GS-10, GS-13."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dataplane_contracts.catalogue import PURE_HANDLERS, REFUSES_DELEGATION
from dataplane_contracts.ds import Organization
from dataplane_contracts.keys import values_of_type
from dataplane_contracts.plans import Plan
from dataplane_service_kit.errors import ServiceError
from query_gateway.rules.caller import Caller


@dataclass(frozen=True)
class LayerRequest:
    """One layer to apply. `principals` None = self-service; a tuple (even empty) = delegated.
    `organizations` None = the caller's own reading organizations (normal path); a tuple = the
    consumer's organizations from the verdict (dataspace path, GS-13)."""

    dataset_id: str
    handler: str
    args: Mapping[str, Any]
    caller: Caller | None
    principals: tuple[str, ...] | None = None
    keys: tuple[str, ...] = ()
    organizations: tuple[Organization, ...] | None = None

    def __repr__(self) -> str:
        return f"LayerRequest(dataset_id={self.dataset_id!r}, handler={self.handler!r}, <hidden>)"

    __str__ = __repr__


def _arg(req: LayerRequest, name: str) -> str | None:
    value = req.args.get(name)
    return value if isinstance(value, str) and value else None


def _invalid(req: LayerRequest, what: str) -> ServiceError:
    return ServiceError("row_filter_invalid", f"row filter {req.handler} for {req.dataset_id} {what}")


def _names_subjects(req: LayerRequest) -> bool:
    return bool(req.principals) or bool(req.keys)


def apply_pure(req: LayerRequest) -> Plan:
    """The plan of a pure handler; raises row_filter_invalid (500) or row_filter_unenforceable."""
    if req.handler not in PURE_HANDLERS:
        raise ValueError(f"{req.handler} is not a pure handler")
    if req.handler in REFUSES_DELEGATION and _names_subjects(req):
        raise ServiceError(
            "row_filter_unenforceable",
            f"Cannot enforce row filter handler '{req.handler}' for {req.dataset_id}: "
            "it refuses delegation; no rows may be served",
        )
    if req.handler == "allow_all":
        return Plan.allow_all()
    if req.handler == "deny_all":
        return Plan.deny()
    if req.handler == "member_wide":
        return Plan.allow_all()
    if req.handler == "subject_key_match":
        return _subject_key_match(req)
    if req.handler == "direct_user_match":
        return _direct_user_match(req)
    return _organization_match(req)


def _subject_key_match(req: LayerRequest) -> Plan:
    """RF-04: the column against the values of `key_type` only; principals are never a fallback."""
    column, key_type = _arg(req, "column"), _arg(req, "key_type")
    if column is None:
        raise _invalid(req, "names no column")
    if key_type is None:
        raise _invalid(req, "names no key_type")
    values = values_of_type(req.keys, key_type)
    return Plan.among(column, values, key_type=key_type, label=f"{key_type} keys")


def _direct_user_match(req: LayerRequest) -> Plan:
    column = _arg(req, "column")
    if column is None:
        raise _invalid(req, "names no column")
    if req.principals is None:  # self-service: the caller's own rows
        own = req.caller.sub if req.caller is not None else None
        return Plan.among(column, [own] if own else [], label="user ids")
    return Plan.among(column, sorted(set(req.principals)), label="user ids")  # [] → deny (RF-05)


def _organization_match(req: LayerRequest) -> Plan:
    """GS-06 on the normal path (reading organizations; services pass), GS-13 on the dataspace
    path (the consumer's organizations from the verdict; none → no rows)."""
    column, org_type = _arg(req, "column"), _arg(req, "org_type")
    if column is None and org_type is None:
        raise _invalid(req, "names neither column nor org_type")
    orgs: Sequence[tuple[str, tuple[str, ...]]]
    if req.organizations is not None:
        orgs = [(o.alias, tuple(o.types)) for o in req.organizations]
    elif req.caller is None:
        return Plan.deny()
    elif req.caller.service_account:
        return Plan.allow_all()
    else:
        orgs = [(o.alias, o.types) for o in req.caller.reading_orgs()]
    if org_type is not None:
        orgs = [o for o in orgs if org_type in o[1]]
    aliases = sorted({alias for alias, _ in orgs})
    if not aliases:
        return Plan.deny()
    if column is None:
        return Plan.allow_all()
    return Plan.among(column, aliases, label="organization aliases")
