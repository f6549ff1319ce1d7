"""Settings every part agrees on (docs/configuration.md), as mixins a service's own
`BaseSettings` inherits. Names are the environment variables; secrets are `SecretStr`."""

from __future__ import annotations

import json
import ssl
from typing import Any

from pydantic import AnyHttpUrl, Field, FilePath, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

# hide_input_in_errors: a refused variable may be a secret; its value never reaches an error text
BASE_CONFIG = SettingsConfigDict(extra="ignore", frozen=True, case_sensitive=False, hide_input_in_errors=True)


class HttpSettings(BaseSettings):
    model_config = BASE_CONFIG
    http_host: str = "0.0.0.0"
    http_port: int = Field(default=8000, ge=1, le=65535)
    log_level: str = "INFO"
    # how long the server keeps an idle keep-alive connection (dataplane_service_kit.serve): above
    # the keep-alive expiry of whatever calls the service (an ingress included), so the client,
    # never the server, closes an idle connection
    http_keep_alive_timeout_seconds: float = Field(default=75.0, ge=1, le=3600)


class KafkaSettings(BaseSettings):
    model_config = BASE_CONFIG
    kafka_bootstrap_servers: str = Field(min_length=1)
    # 500 / true suit a production cluster, whose long poll answers as soon as data arrives, so a
    # long wait costs no latency there. A broker that sleeps out the whole wait (the local Tansu)
    # needs each consumer's wait chosen for its job: the two below override this default.
    kafka_fetch_max_wait_ms: int = Field(default=500, ge=0, le=60_000)
    # request/reply readers (the resolver's plan requests, a gateway's plan replies) while
    # requests are in flight; unset: kafka_fetch_max_wait_ms
    kafka_rpc_fetch_max_wait_ms: int | None = Field(default=None, ge=0, le=60_000)
    # latency-tolerant consumers (the audit relay): on a sleeping broker a long wait is what keeps
    # an idle consumer cheap; unset: kafka_fetch_max_wait_ms
    kafka_bulk_fetch_max_wait_ms: int | None = Field(default=None, ge=0, le=60_000)
    kafka_enable_idempotence: bool = True

    def rpc_fetch_max_wait_ms(self) -> int:
        return (
            self.kafka_fetch_max_wait_ms
            if self.kafka_rpc_fetch_max_wait_ms is None
            else self.kafka_rpc_fetch_max_wait_ms
        )

    def bulk_fetch_max_wait_ms(self) -> int:
        bulk = self.kafka_bulk_fetch_max_wait_ms
        return self.kafka_fetch_max_wait_ms if bulk is None else bulk


class RedisSettings(BaseSettings):
    model_config = BASE_CONFIG
    redis_url: str = Field(min_length=1)
    # explicit bounds rather than the client library's defaults: a stopped Redis answers a
    # request's cache read within these, as a coded refusal, instead of holding it
    redis_connect_timeout_seconds: float = Field(default=1.0, gt=0, le=60)
    redis_socket_timeout_seconds: float = Field(default=2.0, gt=0, le=60)


class PlanCacheSettings(BaseSettings):
    model_config = BASE_CONFIG
    row_filters_cache_ttl: int = Field(default=300, ge=0)
    row_filters_cache_maxsize: int = Field(default=10_000, ge=1)
    row_filters_cache_key_secret: SecretStr

    @field_validator("row_filters_cache_key_secret")
    @classmethod
    def _long_enough(cls, v: SecretStr) -> SecretStr:
        if len(v.get_secret_value()) < 16:
            raise ValueError("must be at least 16 characters")
        return v


class OidcSettings(BaseSettings):
    """Token validation and this service's own client credentials."""

    model_config = BASE_CONFIG
    celine_oidc_base_url: AnyHttpUrl | None = None
    celine_oidc_jwks_uri: AnyHttpUrl | None = None
    celine_oidc_audience: str | None = None
    celine_oidc_client_id: str | None = None
    celine_oidc_client_secret: SecretStr | None = None

    def oidc_issuer(self) -> str | None:
        return str(self.celine_oidc_base_url).rstrip("/") if self.celine_oidc_base_url else None

    def oidc_jwks_uri(self) -> str | None:
        if self.celine_oidc_jwks_uri:
            return str(self.celine_oidc_jwks_uri)
        issuer = self.oidc_issuer()
        return f"{issuer}/protocol/openid-connect/certs" if issuer else None

    def oidc_token_url(self) -> str | None:
        issuer = self.oidc_issuer()
        return f"{issuer}/protocol/openid-connect/token" if issuer else None


class OutboundTlsSettings(BaseSettings):
    """The trust store of every outbound TLS client (docs/configuration.md, "Trust store and
    proxies"): the system store, plus the CA certificates of this PEM file when it is set."""

    model_config = BASE_CONFIG
    dataplane_ca_bundle: FilePath | None = None

    @field_validator("dataplane_ca_bundle")
    @classmethod
    def _holds_certificates(cls, v: FilePath | None) -> FilePath | None:
        # read at start-up, so a bundle that is not PEM stops the service with the variable's name
        # instead of failing every later TLS handshake
        if v is not None:
            try:
                ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=str(v))
            except (ssl.SSLError, OSError) as exc:
                raise ValueError(
                    f"not a readable PEM file of CA certificates ({type(exc).__name__})"
                ) from None
        return v


class ConnectorSettings(BaseSettings):
    """Connector resolution (docs/gateway.md): one default, or a map provider → connector."""

    model_config = BASE_CONFIG
    connector_internal_url: AnyHttpUrl | None = None
    connector_internal_urls: dict[str, AnyHttpUrl] = Field(default_factory=dict)

    @field_validator("connector_internal_urls", mode="before")
    @classmethod
    def _json_map(cls, v: Any) -> Any:
        if isinstance(v, str):
            return json.loads(v) if v.strip() else {}
        return v
