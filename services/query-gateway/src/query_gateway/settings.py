"""query-gateway configuration (docs/configuration.md). A misconfigured gateway refuses
to start naming the variable; it never starts degraded."""

from __future__ import annotations

from typing import Annotated, Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import NoDecode

from dataplane_contracts.settings import (
    ConnectorSettings,
    HttpSettings,
    KafkaSettings,
    OidcSettings,
    OutboundTlsSettings,
    PlanCacheSettings,
    RedisSettings,
)


class Settings(
    HttpSettings,
    KafkaSettings,
    RedisSettings,
    PlanCacheSettings,
    OidcSettings,
    ConnectorSettings,
    OutboundTlsSettings,
):
    catalogue_path: str = Field(min_length=1)
    datasets_database_url: str = Field(min_length=1)
    datasets_pool_max_size: int = Field(default=10, ge=1, le=1000)  # connections to the datasets
    row_filters_resolve_timeout_ms: int = Field(default=20_000, ge=1)
    # comma-separated names of the plugin handlers the deployment's resolvers load (their
    # ROW_FILTERS_MODULES and entry points): a catalogue handler neither built in nor listed
    # here refuses start-up (and a reload), naming it
    row_filters_plugin_handlers: Annotated[tuple[str, ...], NoDecode] = ()
    audit_publish_timeout_ms: int = Field(default=5_000, ge=1)
    query_statement_timeout_ms: int = Field(default=5_000, ge=1)
    # what an anonymous caller can make the gateway do before any refusal: validating the longest
    # statement of the costliest shapes took 35-125 ms of CPU (sqlglot 30, a loaded 2-core host;
    # about 10 us per character, twice that at 16 KiB); the body holds that statement however it
    # is JSON-escaped (at most 12 bytes per character) and decodes in a few ms
    query_max_sql_chars: int = Field(default=8_192, ge=1)
    query_max_body_bytes: int = Field(default=131_072, ge=1)
    edr_enabled: bool = False
    dps_enabled: bool = False
    dps_token_public_key: str | None = None
    dps_flows_database_url: str | None = None
    # the plan.replies partition this instance reads; unset = derived from a random instance id
    plan_reply_partition: int | None = Field(default=None, ge=0)
    # how long a miss waits for the early copy of its reply before fetching the Kafka reply too
    plan_reply_kafka_fallback_ms: int = Field(default=50, ge=0, le=10_000)
    connector_timeout_seconds: float = Field(default=5.0, gt=0)
    # below ds's idle timeout (uvicorn's default is 5 s): the gateway drops an idle connection
    # before ds closes it, so a question is never sent on a connection ds is closing
    connector_keepalive_expiry_seconds: float = Field(default=4.0, ge=0)
    # the gateway's own bounds on its databases; PostgreSQL's statement_timeout cannot fire on a
    # server that is not running. Waiting for (or opening) a pooled connection, and returning it:
    database_acquire_timeout_ms: int = Field(default=2_000, ge=1)
    # one statement's answer, client side; unset = QUERY_STATEMENT_TIMEOUT_MS + 2 s, so the
    # server's own timeout (400 query_timeout) fires first whenever the server is running
    database_command_timeout_ms: int | None = Field(default=None, ge=1)
    # the whole DPS pull-grant read (acquire, read, release)
    dps_grant_timeout_ms: int = Field(default=2_000, ge=1)
    # ds's answers reused for the ttl ds sends with each (query_gateway.clients.decision_cache)
    ds_decision_cache_enabled: bool = True
    ds_decision_cache_maxsize: int = Field(default=10_000, ge=1)
    # the per-deployment key of the catalogue's `hash` column masks (sql/exposure.py); required
    # at start-up when any dataset declares one. Changing it changes every pseudonym
    column_mask_key: SecretStr | None = None
    # GS-14: every consumer's token bucket per dataset, where the catalogue names none for it
    # (`rate_limit:`). 0 is the operator's choice of no default limit (a dataset's own still
    # applies); it is never what an error turns the limiter into: a bucket that cannot be read
    # refuses the request (503 rate_limit_unavailable)
    rate_limit_per_second: float = Field(default=0, ge=0, le=1_000_000)
    # the most tokens a bucket holds; 0 = one second's worth (at least 1)
    rate_limit_burst: int = Field(default=0, ge=0, le=1_000_000)
    # QE-06: PostgreSQL's estimated cost of a narrowed statement above which it is refused
    # before it runs (400 query_too_expensive); 0 = no fixed ceiling (with the calibration off
    # too, no estimate asked: no extra round trip)
    query_max_plan_cost: float = Field(default=0, ge=0)
    # QE-06: measure the database's cost units per millisecond at start-up and refuse an
    # estimate that could not finish inside the statement timeout (below QUERY_MAX_PLAN_COST
    # where that is set lower); off leaves only QUERY_MAX_PLAN_COST
    query_plan_cost_calibrate: bool = True
    # QE-10: the statements one consumer may have running on this replica at once; one more is
    # refused 429 too_many_concurrent_queries, so its slow statements leave the pool to others.
    # 0 turns the replica's share off
    query_max_concurrent_per_consumer: int = Field(default=3, ge=0, le=1000)
    # QE-10: the same across every replica, counted as leases in Redis; 0 turns the total off.
    # A total that cannot be counted leaves the replica's share to bound the statement
    query_max_concurrent_per_consumer_total: int = Field(default=6, ge=0, le=100_000)
    # QE-11: the most bytes any value of a statement may grow to, bound statically before it runs
    # (400 query_too_expensive past it); no value turns it off: a statement that can grow one
    # backend's memory past every other guard is refused whatever the deployment
    query_max_value_bytes: int = Field(default=4 * 1024 * 1024, ge=64 * 1024, le=1024 * 1024 * 1024)
    # the key that signs records cursors (docs/records.md); required at start-up on a DPS gateway
    # whose catalogue declares `records:`. Changing it invalidates every cursor handed out
    records_cursor_secret: SecretStr | None = None

    @field_validator("records_cursor_secret")
    @classmethod
    def _cursor_secret_long_enough(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None and len(v.get_secret_value()) < 32:
            raise ValueError("must be at least 32 characters")
        return v

    @field_validator("row_filters_plugin_handlers", mode="before")
    @classmethod
    def _split_names(cls, v: Any) -> Any:
        if isinstance(v, str):
            return tuple(part.strip() for part in v.split(",") if part.strip())
        return v

    @field_validator("column_mask_key")
    @classmethod
    def _mask_key_long_enough(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None and len(v.get_secret_value()) < 16:
            raise ValueError("must be at least 16 characters")
        return v

    @field_validator("dps_token_public_key")
    @classmethod
    def _ec_public_key(cls, v: str | None) -> str | None:
        if v is None or not v.strip():
            return None
        try:
            key = serialization.load_pem_public_key(v.encode())
        except ValueError:
            raise ValueError("must be a PEM public key") from None
        if not isinstance(key, ec.EllipticCurvePublicKey):
            raise ValueError("must be an EC (P-256) public key")
        return v

    @property
    def database_command_timeout_s(self) -> float:
        ms = self.database_command_timeout_ms
        return (ms if ms is not None else self.query_statement_timeout_ms + 2_000) / 1000

    @model_validator(mode="after")
    def _command_outlasts_statement(self) -> Settings:
        ms = self.database_command_timeout_ms
        if ms is not None and ms <= self.query_statement_timeout_ms:
            # else a slow statement would read as a lost database (503) instead of 400 query_timeout
            raise ValueError("DATABASE_COMMAND_TIMEOUT_MS must exceed QUERY_STATEMENT_TIMEOUT_MS")
        return self

    @property
    def dps_grant_timeout_s(self) -> float:
        return self.dps_grant_timeout_ms / 1000

    @model_validator(mode="after")
    def _dps_complete(self) -> Settings:
        if self.dps_enabled:
            missing = [
                name
                for name, value in (
                    ("DPS_TOKEN_PUBLIC_KEY", self.dps_token_public_key),
                    ("DPS_FLOWS_DATABASE_URL", self.dps_flows_database_url),
                )
                if not value
            ]
            if missing:
                raise ValueError(f"DPS_ENABLED requires {', '.join(missing)}")
        return self
