"""What every handler gets, and small argument readers shared by the built-ins."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from dataplane_contracts.catalogue import REFUSES_DELEGATION
from dataplane_contracts.plans import CallerIdentity, ClaimCheck, Plan
from filter_resolver.errors import invalid, unenforceable


class Handler(Protocol):
    """A resolve-phase handler. It raises ResolveError for a final answer and a transient
    exception (see retry.is_transient) for a failure worth another attempt."""

    name: str

    async def resolve(self, claim: ClaimCheck) -> Plan: ...


def required_str(handler: str, args: Mapping[str, Any], name: str) -> str:
    value = args.get(name)
    if not isinstance(value, str) or not value:
        raise invalid(f"{handler}: argument '{name}' is required")
    return value


def optional_str(handler: str, args: Mapping[str, Any], name: str, default: str) -> str:
    value = args.get(name, default)
    if not isinstance(value, str) or not value:
        raise invalid(f"{handler}: argument '{name}' must be a non-empty string")
    return value


def refuse_delegation(claim: ClaimCheck) -> None:
    """A handler that reads the caller's own rows (REFUSES_DELEGATION, shared with the gateway)
    cannot answer a delegated request, even one naming nobody (RF-06)."""
    if claim.handler in REFUSES_DELEGATION and (claim.principals is not None or claim.keys):
        raise unenforceable(f"{claim.handler} refuses a delegated request")


def person_caller(handler: str, claim: ClaimCheck) -> CallerIdentity:
    if claim.caller is None:
        raise invalid(f"{handler}: a self-service request names no caller")
    return claim.caller


def unique_in_order(values: list[Any]) -> list[Any]:
    """Drop repeats but keep the upstream's order (docs/row-filters.md, "Handlers")."""
    seen: set[Any] = set()
    out: list[Any] = []
    for v in values:
        marker = (type(v), v)
        if marker not in seen:
            seen.add(marker)
            out.append(v)
    return out
