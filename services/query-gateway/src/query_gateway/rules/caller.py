"""The normal path's verified caller as the rules read it (docs/gateway.md, "Identity"): what the
policy and the layers judge, without the verification that produced it (clients/identity.py)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from dataplane_contracts.ds import Organization
from dataplane_contracts.plans import CallerIdentity

PLATFORM_ADMIN_ROLE = "platform-admin"
READING_GROUPS = frozenset({"admins", "managers", "viewers"})


@dataclass(frozen=True)
class OrgMembership:
    alias: str
    types: tuple[str, ...]
    groups: tuple[str, ...]


@dataclass(frozen=True)
class Caller:
    """A verified caller. `token` is kept only to forward to a lookup handler; never logged."""

    sub: str | None
    username: str | None
    email: str | None
    client_id: str | None
    roles: frozenset[str]
    scopes: frozenset[str]
    service_account: bool
    orgs: tuple[OrgMembership, ...]
    exp: int | None
    token: str = field(repr=False)

    @property
    def platform_admin(self) -> bool:
        return PLATFORM_ADMIN_ROLE in self.roles

    def reading_orgs(self) -> tuple[OrgMembership, ...]:
        """Organizations in which the caller holds a reading group (docs/gateway.md), sorted by alias."""
        return tuple(sorted((o for o in self.orgs if READING_GROUPS & set(o.groups)), key=lambda o: o.alias))

    def identity(self) -> CallerIdentity:
        return self._identity

    @functools.cached_property
    def _identity(self) -> CallerIdentity:
        # built once per verified bearer (callers are memoised); CallerIdentity is frozen
        return CallerIdentity(
            sub=self.sub,
            username=self.username,
            email=self.email,
            service_account=self.service_account,
            token=self.token,
            token_exp=self.exp,
            organizations=tuple(Organization(alias=o.alias, types=o.types) for o in self.reading_orgs()),
        )

    def __repr__(self) -> str:
        return f"Caller(service_account={self.service_account}, <hidden>)"

    __str__ = __repr__
