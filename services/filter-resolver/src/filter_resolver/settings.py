"""The resolver's settings: the shared mixins of `dataplane_contracts.settings` plus its own.

Names are the environment variables (docs/configuration.md)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import NoDecode

from dataplane_contracts.settings import (
    HttpSettings,
    KafkaSettings,
    OidcSettings,
    OutboundTlsSettings,
    PlanCacheSettings,
    RedisSettings,
)
from dataplane_contracts.topics import PLAN_REQUESTS

GROUP_ID = "dataplane-filter-resolver"


class Settings(
    HttpSettings, KafkaSettings, RedisSettings, PlanCacheSettings, OidcSettings, OutboundTlsSettings
):
    http_port: int = Field(default=8002, ge=1, le=65535)

    rec_registry_url: str = "http://api.celine.localhost/rec-registry"
    rec_registry_timeout_seconds: float = Field(default=5.0, gt=0)
    rec_registry_lookup_scope: str = "rec-registry.lookup"

    # read-only role on the datasets database: table_pointer reads pointer tables through it
    datasets_database_url: SecretStr | None = None

    # comma-separated module names (not JSON): each exposes ROW_FILTERS or register(registry)
    row_filters_modules: Annotated[tuple[str, ...], NoDecode] = ()
    # the plugin handler names the gateway's catalogue may use (the same variable the gateway
    # reads): each must be provided by a loaded plugin, else start-up is refused naming it
    row_filters_plugin_handlers: Annotated[tuple[str, ...], NoDecode] = ()

    # a blip is retried, an outage is reported (docs/row-filters.md, "Two phases")
    resolver_retry_attempts: int = Field(default=3, ge=1, le=10)
    resolver_retry_base_ms: int = Field(default=20, ge=0, le=10_000)

    # overridable so a test or a second environment can run on its own topic and group
    plan_requests_topic: str = Field(default=PLAN_REQUESTS, min_length=1)
    resolver_group_id: str = Field(default=GROUP_ID, min_length=1)
    resolver_max_batch: int = Field(default=100, ge=1, le=10_000)

    # The request consumer's fetch wait once no request has come for resolver_idle_after_ms;
    # the first request to arrive brings back KAFKA_RPC_FETCH_MAX_WAIT_MS. Unset: no change,
    # which is right for a broker whose long poll answers when data arrives (a real cluster).
    # On a broker that sleeps out the whole wait (the local Tansu) a longer idle wait is cheaper
    # but delays the first request after a quiet spell by up to that wait.
    resolver_idle_fetch_max_wait_ms: int | None = Field(default=None, ge=0, le=60_000)
    resolver_idle_after_ms: int = Field(default=2_000, ge=0, le=600_000)

    @field_validator("row_filters_modules", "row_filters_plugin_handlers", mode="before")
    @classmethod
    def _split_modules(cls, v: Any) -> Any:
        if isinstance(v, str):
            return tuple(part.strip() for part in v.split(",") if part.strip())
        return v
