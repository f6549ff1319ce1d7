"""What the lifespan builds and every request reads: the clients, the catalogue and its index.
Typed, without behaviour; one object on `app.state.gateway`, swapped whole when the catalogue is
read again (a request keeps the one it started with)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dataplane_contracts.catalogue import Catalogue, DatasetEntry
from dataplane_service_kit.bounded_cache import BoundedCache
from query_gateway.clients.concurrency import ConsumerSlots
from query_gateway.clients.connector import ConnectorClient
from query_gateway.clients.disclosure import DisclosurePublisher
from query_gateway.clients.identity import OidcVerifier
from query_gateway.clients.plan_client import PlanClient
from query_gateway.clients.pull import PullVerifier
from query_gateway.clients.rate_limit import RateLimiter
from query_gateway.metrics import Metrics
from query_gateway.rules.policy import needs_caller
from query_gateway.settings import Settings
from query_gateway.sql import ColumnTypes, MaskKey, QueryExecutor

GROWTH_VERDICTS_KEPT = 1024


@dataclass
class Gateway:
    settings: Settings
    catalogue: Catalogue
    columns: ColumnTypes
    executor: QueryExecutor
    plans: PlanClient
    oidc: OidcVerifier
    connector: ConnectorClient
    disclosures: DisclosurePublisher
    pull: PullVerifier | None = None
    mask_key: MaskKey | None = None  # COLUMN_MASK_KEY, for the catalogue's `hash` column masks
    # the database's leakproof comparison operators (sql/leakproof.py); empty: every narrowing fenced
    leakproof: frozenset[tuple[str, str, str]] = frozenset()
    limiter: RateLimiter | None = None  # GS-14: the consumers' buckets (None: nothing limited)
    # QE-10: each consumer's statements running on this replica; kept across catalogue reloads
    slots: ConsumerSlots = field(default_factory=lambda: ConsumerSlots(0))
    metrics: Metrics = field(default_factory=Metrics)  # this app's registry (served by /metrics)
    entries: dict[str, DatasetEntry] = field(default_factory=dict)
    # some dataset can be read without a bearer: else an anonymous request is refused 401 before
    # its statement is parsed (what the statement says is no business of an anonymous caller)
    anonymous_readable: bool = False
    # QE-11's verdict per statement text ("" = within the budget, else the refusal's reason): a
    # repeated statement is not bounded again. Not an init field, so a catalogue reload (which
    # may change the column types the bound reads) starts with none
    growth_verdicts: BoundedCache[str, str] = field(
        default_factory=lambda: BoundedCache(GROWTH_VERDICTS_KEPT), init=False
    )

    def __post_init__(self) -> None:
        self.entries = self.catalogue.by_id()
        self.anonymous_readable = any(
            entry.expose and entry.access_level != "secret" and not needs_caller(entry)
            for entry in self.catalogue.datasets
        )


def gateway_of(app_state: Any) -> Gateway:
    """The gateway the lifespan set on the app's state (typed for the routes that read it)."""
    gw: Gateway = app_state.gateway
    return gw
