"""Access levels and the dataset policy (docs/gateway.md), with *row-scoped* meaning "the
organization layer is not `allow_all`" (GS-07). Every refusal is raised, never returned."""

from __future__ import annotations

from dataplane_contracts.catalogue import DatasetEntry, RowFilterSpec
from dataplane_service_kit.errors import ServiceError
from query_gateway.rules.caller import Caller

LEVELS_NEEDING_AUTH = frozenset({"internal", "restricted"})


def is_allow_all(spec: RowFilterSpec | None) -> bool:
    return spec is not None and spec.handler == "allow_all"


def is_public(entry: DatasetEntry) -> bool:
    """Both layers admit every row: no handler needs to know who asks."""
    return is_allow_all(entry.row_filters.person) and is_allow_all(entry.row_filters.organization)


def row_scoped(entry: DatasetEntry) -> bool:
    return not is_allow_all(entry.row_filters.organization)


def check_available(entry: DatasetEntry) -> None:
    """The expose gate: not exposed, `secret` → 403 not_available."""
    if not entry.expose or entry.access_level == "secret":
        raise ServiceError("not_available", "Dataset not available")


def check_layers_declared(entry: DatasetEntry) -> None:
    """GS-10: a `deny_all` or undeclared layer refuses the dataset before any handler runs."""
    for layer in ("person", "organization"):
        spec: RowFilterSpec | None = getattr(entry.row_filters, layer)
        if spec is None or spec.handler == "deny_all":
            raise ServiceError("row_policy_denied", f"dataset {entry.id}: the {layer} layer admits no rows")


def needs_caller(entry: DatasetEntry) -> bool:
    return entry.access_level in LEVELS_NEEDING_AUTH or not is_public(entry)


def _has_scope(caller: Caller, *wanted: str) -> bool:
    return any(s in caller.scopes for s in wanted)


def check_policy(entry: DatasetEntry, caller: Caller) -> None:
    """The policy for `internal` and `restricted`; `open` has no policy. Raises 403 policy."""
    level = entry.access_level
    if level == "open":
        return
    if caller.platform_admin:
        return
    if level == "internal":
        if caller.service_account:
            if _has_scope(caller, "dataset.query", "dataset.admin"):
                return
            raise ServiceError("policy", "missing required scope")
        if not caller.reading_orgs():
            raise ServiceError("policy", "user not in authorized group")
        if not row_scoped(entry):
            raise ServiceError(
                "policy", "internal dataset without a row filter - platform-admin or services only"
            )
        return
    if level == "restricted":
        if caller.service_account and _has_scope(caller, "dataset.admin"):
            return
        raise ServiceError("policy", "restricted dataset requires admin scope or platform-admin role")
    raise ServiceError("not_available", "Dataset not available")
