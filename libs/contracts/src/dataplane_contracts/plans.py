"""Plans, the RF-07 plan-cache key, the Redis layout, the claim check and the plugin interface.

A plan is one of: no predicate (`all`), `deny`, or `in` (column ∈ values). Its meta carries a
count and the key type, never values (RF-08)."""

from __future__ import annotations

import hashlib
import hmac
import inspect
import json
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import Field, StrictBool, StrictFloat, StrictInt, StrictStr, model_validator

from dataplane_contracts.base import ContractModel
from dataplane_contracts.ds import Organization

PlanValue = StrictStr | StrictInt | StrictFloat | StrictBool


class PlanMeta(ContractModel):
    count: StrictInt = 0
    key_type: StrictStr | None = None
    label: StrictStr | None = None  # e.g. "pod keys", "organization aliases" for /query/plan


class Plan(ContractModel):
    kind: Literal["all", "deny", "in"]
    column: StrictStr | None = None
    values: tuple[PlanValue, ...] = Field(default=(), repr=False)  # keys in clear (RF-08)
    meta: PlanMeta = Field(default_factory=PlanMeta)

    @model_validator(mode="after")
    def _shape(self) -> Plan:
        if self.kind == "in":
            if not self.column:
                raise ValueError("an `in` plan names its column")
            if not self.values:
                raise ValueError("an empty allow-list is a deny, never IN ()")  # RF-05, RF-11
        elif self.values or self.column:
            raise ValueError(f"a `{self.kind}` plan carries no column or values")
        return self

    @classmethod
    def allow_all(cls) -> Plan:
        return cls(kind="all")

    @classmethod
    def deny(cls, key_type: str | None = None) -> Plan:
        return cls(kind="deny", meta=PlanMeta(count=0, key_type=key_type))

    @classmethod
    def among(
        cls, column: str, values: Sequence[Any], key_type: str | None = None, label: str | None = None
    ) -> Plan:
        """column ∈ values; an empty list is a deny (RF-05)."""
        if not values:
            return cls.deny(key_type)
        return cls(
            kind="in",
            column=column,
            values=tuple(values),
            meta=PlanMeta(count=len(values), key_type=key_type, label=label),
        )

    def __repr__(self) -> str:
        return f"Plan(kind={self.kind!r}, column={self.column!r}, values=<{len(self.values)}>)"

    __str__ = __repr__


# ---- RF-07 cache key -----------------------------------------------------------------------------


class PlanKeyInputs(ContractModel):
    """Everything a plan depends on. Never rendered: only its HMAC digest leaves the process."""

    handler: StrictStr
    table: StrictStr
    # every input but handler and table is kept out of pydantic's renderings (RF-07)
    caller: StrictStr | None = Field(repr=False)  # the caller's subject; None when delegated (dataspace)
    # None (self-service) and () (delegated, nobody) differ
    principals: tuple[StrictStr, ...] | None = Field(repr=False)
    keys: tuple[StrictStr, ...] = Field(default=(), repr=False)
    organizations: tuple[Organization, ...] = Field(default=(), repr=False)
    args: Mapping[str, Any] = Field(default_factory=dict, repr=False)

    def __repr__(self) -> str:
        return f"PlanKeyInputs(handler={self.handler!r}, table={self.table!r}, <hidden>)"

    __str__ = __repr__

    def canonical(self) -> bytes:
        doc = {
            "h": self.handler,
            "t": self.table,
            "c": self.caller,
            # a tagged form keeps None and [] apart: they mean different requests (RF-05)
            "p": None if self.principals is None else ["list", sorted(self.principals)],
            "k": sorted(set(self.keys)),
            "o": sorted([o.alias, sorted(o.types)] for o in self.organizations),
            "a": self.args,
        }
        return json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str).encode()


def plan_cache_key(inputs: PlanKeyInputs, secret: bytes) -> str:
    """The RF-07 key: an HMAC-SHA256 hex digest; nothing in it can be read back."""
    return hmac.new(secret, inputs.canonical(), hashlib.sha256).hexdigest()


# ---- Redis layout ---------------------------------------------------------------------------------

REDIS_PREFIX = "dataplane:"


def redis_plan_key(digest: str) -> str:
    """A cached plan: JSON of `Plan`, with the plan's TTL as the Redis TTL."""
    return f"{REDIS_PREFIX}plan:{digest}"


def redis_one_shot_key(token: str) -> str:
    """A plan whose TTL is ≤ 0: read once with GETDEL by the requesting gateway."""
    return f"{REDIS_PREFIX}plan-once:{token}"


def redis_reply_channel(instance_id: str) -> str:
    """A gateway instance's pub/sub channel for early copies of its plan replies."""
    return f"{REDIS_PREFIX}plan-replies:{instance_id}"


def redis_claim_key(claim_id: str) -> str:
    """A claim check: JSON of `ClaimCheck`, TTL = the request deadline; taken with GETDEL."""
    return f"{REDIS_PREFIX}claim:{claim_id}"


ONE_SHOT_TTL_SECONDS = 30  # how long a one-shot plan waits for its reader


# ---- claim check ----------------------------------------------------------------------------------


class CallerIdentity(ContractModel):
    # identity and token kept out of pydantic's renderings too, not only out of __repr__
    sub: StrictStr | None = Field(default=None, repr=False)
    username: StrictStr | None = Field(default=None, repr=False)
    email: StrictStr | None = Field(default=None, repr=False)
    service_account: StrictBool = False
    token: StrictStr | None = Field(default=None, repr=False)
    token_exp: StrictInt | None = None  # epoch seconds; bounds the plan TTL on the normal path
    organizations: tuple[Organization, ...] = Field(default=(), repr=False)

    def __repr__(self) -> str:
        return f"CallerIdentity(service_account={self.service_account}, <hidden>)"

    __str__ = __repr__


class ClaimCheck(ContractModel):
    """The inputs of a resolve, held in Redis under a random id; the Kafka request names only the id."""

    handler: StrictStr
    args: dict[str, Any] = Field(default_factory=dict)
    table: StrictStr
    binds: Literal["person", "organization"] = "person"
    # the request's personal inputs are kept out of pydantic's renderings too (RF-07, RF-08)
    caller: CallerIdentity | None = Field(default=None, repr=False)
    principals: tuple[StrictStr, ...] | None = Field(default=None, repr=False)
    keys: tuple[StrictStr, ...] = Field(default=(), repr=False)
    organizations: tuple[Organization, ...] = Field(default=(), repr=False)
    ds_cache_ttl: StrictInt | None = None  # dataspace path: ds's cache.ttl_seconds
    request_context: dict[str, StrictStr] = Field(default_factory=dict, repr=False)

    def __repr__(self) -> str:
        return f"ClaimCheck(handler={self.handler!r}, table={self.table!r}, <hidden>)"

    __str__ = __repr__

    def key_inputs(self) -> PlanKeyInputs:
        return PlanKeyInputs(
            handler=self.handler,
            table=self.table,
            caller=self.caller.sub if self.caller else None,
            principals=self.principals,
            keys=self.keys,
            organizations=self.organizations,
            args=self.args,
        )


def plan_ttl(default_ttl: int, ds_cache_ttl: int | None, token_exp: int | None, now: float) -> int:
    """RF-07: the default TTL, shortened to ds's cache_ttl (dataspace) or the token's remaining
    lifetime (normal path), clamped to [0, default]. ≤ 0 means: do not cache."""
    ttl = default_ttl
    if ds_cache_ttl is not None:
        ttl = min(ttl, ds_cache_ttl)
    if token_exp is not None:
        ttl = min(ttl, int(token_exp - now))
    return max(0, ttl)


# ---- plugin interface (RF-09) ---------------------------------------------------------------------


@runtime_checkable
class RowFilterPlugin(Protocol):
    """A row-filter handler from ROW_FILTERS_MODULES or the `celine.dataset.row_filters` entry
    points. `resolve` receives table, args, caller, principals and request_context as keywords;
    `keys` only if it declares a `keys` parameter or `**kwargs` (RF-09)."""

    name: str

    def resolve(self, **kwargs: Any) -> Plan | Awaitable[Plan]: ...


def accepts_keys(resolve: Any) -> bool:
    """Whether a resolve callable declares `keys` or takes **kwargs (RF-09)."""
    params = inspect.signature(resolve).parameters.values()
    return any(p.name == "keys" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


ENTRY_POINT_GROUP = "celine.dataset.row_filters"
