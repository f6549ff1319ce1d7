"""Signaling's settings, validated at start-up (a wrong variable stops the service with its name).

Field names are the environment variable names in lower case (no prefix)."""

from __future__ import annotations

import json
from typing import Annotated, Any

from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from pydantic import Field, SecretStr, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from dataplane_contracts.dps import (
    DEFAULT_PULL_GRANT_ROLE,
    REFRESH_PATH,
    canonical_transfer_type,
    is_pull_transfer,
)
from dataplane_contracts.settings import (
    BASE_CONFIG,
    HttpSettings,
    KafkaSettings,
    OidcSettings,
    OutboundTlsSettings,
)

StrList = Annotated[list[str], NoDecode]


def _str_list(v: Any) -> Any:
    """A JSON array, or a comma-separated list (easier to write in a Helm value)."""
    if isinstance(v, str):
        text = v.strip()
        if text.startswith("["):
            return json.loads(text)
        return [p.strip() for p in text.split(",") if p.strip()]
    return v


def async_database_url(url: str) -> str:
    """`postgresql://…` (the asyncpg/libpq form every tool uses) → SQLAlchemy's asyncpg URL."""
    for prefix in ("postgresql+asyncpg://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+asyncpg://" + url[len(prefix) :]
    raise ValueError("must be a postgresql:// URL")


def pull_transfer_types(v: list[str]) -> list[str]:
    """DPS_TRANSFER_TYPES: pull types only, at least one; the http-pull profile is served and
    registered under its URI, whichever spelling is listed."""
    push = [t for t in v if not is_pull_transfer(t)]
    if push:
        raise ValueError(f"only pull transfer types are supported, not {push}")
    if not v:
        raise ValueError("at least one transfer type is needed")
    return list(dict.fromkeys(canonical_transfer_type(t) for t in v))


def load_signing_key(pem: str) -> ec.EllipticCurvePrivateKey:
    """An EC P-256 private key, or ValueError; `\\n` escapes are accepted for one-line env values."""
    if "\n" not in pem and "\\n" in pem:
        pem = pem.replace("\\n", "\n")
    try:
        key = load_pem_private_key(pem.encode(), password=None)
    except (ValueError, TypeError):
        raise ValueError("is not a PEM private key") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, ec.SECP256R1):
        raise ValueError("must be an EC P-256 private key (ES256)")
    return key


class DpsIdentitySettings(BaseSettings):
    """Who this data plane says it is to control planes, and whom it admits: read by the service
    and by `signaling register` (signaling/register.py), so both apply the same rules."""

    model_config = BASE_CONFIG
    dps_dataplane_id: str = "dataset-api"
    dps_transfer_types: StrList = Field(default_factory=lambda: ["HttpData-PULL"])
    dps_labels: StrList = Field(default_factory=list)
    dps_control_plane_clients: StrList = Field(default_factory=list)

    @field_validator("dps_transfer_types", "dps_labels", "dps_control_plane_clients", mode="before")
    @classmethod
    def _lists(cls, v: Any) -> Any:
        return _str_list(v)

    @field_validator("dps_transfer_types")
    @classmethod
    def _pull_only(cls, v: list[str]) -> list[str]:
        return pull_transfer_types(v)


class Settings(HttpSettings, KafkaSettings, OidcSettings, DpsIdentitySettings, OutboundTlsSettings):
    """The shared mixins (HTTP, Kafka, OIDC: `CELINE_OIDC_JWKS_URI` defaults to
    `{CELINE_OIDC_BASE_URL}/protocol/openid-connect/certs`, the token endpoint is
    `{base}/protocol/openid-connect/token`) plus signaling's own variables."""

    # validate_default: the "required when DPS_ENABLED" checks must run for unset variables too
    model_config = SettingsConfigDict(**BASE_CONFIG, validate_default=True)

    http_port: int = Field(default=8001, ge=1, le=65535)
    # the most bytes of a request body; more is 413 body_too_large before the rest is read (a DPS
    # message is a few kilobytes: a 60 MB body was read and parsed whole before this bound)
    signaling_max_body_bytes: int = Field(default=1_048_576, ge=1024, le=64 * 1_048_576)

    database_url: str
    db_pool_size: int = Field(default=5, ge=1)
    # the service's own bounds on its database (a stopped or partitioned server enforces none):
    # waiting for a pooled connection or opening one, and one statement's answer
    db_acquire_timeout_seconds: float = Field(default=5.0, gt=0)
    db_command_timeout_seconds: float = Field(default=10.0, gt=0)

    outbox_relay_enabled: bool = True
    outbox_poll_interval_ms: int = Field(default=500, ge=10)
    outbox_batch_size: int = Field(default=100, ge=1)
    # the signaling_flows gauge is recounted when /metrics is scraped; > 0: at most this often
    flow_metrics_interval_seconds: float = Field(default=0.0, ge=0)

    dps_enabled: bool = False
    dps_signaling_url: str = "http://localhost:8001"
    dps_public_url: str = "http://localhost:8001"
    dps_token_signing_key: SecretStr | None = None
    dps_token_key_id: str | None = None
    # the http-pull profile: access-token lifetime, and the base URL consumers reach for renewal
    # (the `refreshEndpoint` is this + /dps/token; unset: DPS_SIGNALING_URL)
    dps_token_ttl_seconds: int = Field(default=300, ge=1)
    dps_refresh_url: str | None = None
    # for tests and the local doubles only: did:web documents over plain HTTP and on a port
    dps_did_web_allow_http: bool = False
    dps_pull_grant_role: str = DEFAULT_PULL_GRANT_ROLE
    # the gateway's catalogue, read to freeze a flow's client range filters when it starts
    # (docs/records.md); unset: no range filters are offered, and a start asking for them is refused
    catalogue_path: str | None = None
    # asynchronous prepare/start: 202 with PREPARING/STARTING, the transition finished in the
    # background and announced by a DPS-12 callback, retried from the first delay doubling up to
    # the last. Every replica with DPS_CALLBACK_RELAY_ENABLED delivers what any replica owes,
    # whatever its own DPS_ASYNC_SIGNALS
    dps_async_signals: bool = False
    dps_callback_relay_enabled: bool = True
    dps_callback_retry_first_seconds: float = Field(default=1.0, gt=0)
    dps_callback_retry_max_seconds: float = Field(default=60.0, gt=0)

    # a token of an unknown kid inside this interval waits for its end (docs/gateway.md, "Key sets")
    celine_oidc_jwks_min_refetch_seconds: float = Field(default=1.0, ge=0, le=60)
    callback_timeout_seconds: float = Field(default=5.0, gt=0)

    @field_validator("database_url")
    @classmethod
    def _asyncpg(cls, v: str) -> str:
        return async_database_url(v)

    @field_validator("dps_token_signing_key", mode="after")
    @classmethod
    def _ec_key(cls, v: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        if v is None:
            if info.data.get("dps_enabled"):
                raise ValueError("is required when DPS_ENABLED is true")
            return None
        load_signing_key(v.get_secret_value())
        return v

    @model_validator(mode="after")
    def _oidc_when_enabled(self) -> Settings:
        # a model validator: the OIDC fields (from the mixin) are validated before DPS_ENABLED
        if self.dps_enabled:
            missing = [
                name
                for name, value in (
                    ("CELINE_OIDC_BASE_URL", self.celine_oidc_base_url),
                    ("CELINE_OIDC_AUDIENCE", self.celine_oidc_audience),
                )
                if not value
            ]
            if missing:
                raise ValueError(f"{', '.join(missing)} required when DPS_ENABLED is true")
        return self

    def refresh_endpoint(self) -> str:
        return (self.dps_refresh_url or self.dps_signaling_url).rstrip("/") + REFRESH_PATH

    @property
    def signing_key(self) -> ec.EllipticCurvePrivateKey | None:
        if self.dps_token_signing_key is None:
            return None
        return load_signing_key(self.dps_token_signing_key.get_secret_value())
