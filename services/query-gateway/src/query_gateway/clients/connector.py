"""The ds connector as the gateway calls it (docs/gateway.md, docs/wire-contracts.md): the service's
client-credentials token, connector resolution, the EDR key set per connector, and the one authorize
call (its answer reused for the ttl ds gives it, query_gateway.clients.decision_cache)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
import jwt
from pydantic import ValidationError

from dataplane_contracts.ds import AuthorizeRequest, DecisionEnvelope
from dataplane_contracts.settings import ConnectorSettings
from dataplane_service_kit.connectors import ConnectorNotConfigured, UnroutableProvider, connector_base
from dataplane_service_kit.errors import ServiceError
from dataplane_service_kit.jwks import KeySet, KeySetUnavailable, NoUsableKey
from dataplane_service_kit.logs import get_logger
from dataplane_service_kit.oauth import ClientCredentialsToken, TokenUnavailable, service_token
from dataplane_service_kit.outbound_tls import outbound_http
from query_gateway.clients.decision_cache import DsDecisionCache, decision_key
from query_gateway.clients.verified import VerifiedTokens, exp_of, memoisable
from query_gateway.metrics import Metrics
from query_gateway.settings import Settings

log = get_logger("query_gateway.connector")
_EDR_ALGORITHMS = ["ES256", "RS256"]
# a token no held EDR key signed refetches the connector's set at most this often
EDR_REFETCH_SECONDS = 1.0
# a connection closed under the request: the server's idle close crossing our send on a pooled
# connection. Asked again once, on a fresh connection, where the question is idempotent; a
# refused connect or a timeout is not this and is not asked again
_CONNECTION_RESET = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


def connector_http(settings: Settings) -> httpx.AsyncClient:
    """The gateway's client for ds and the issuer: idle connections are dropped after
    CONNECTOR_KEEPALIVE_EXPIRY_SECONDS, below the servers' idle timeout, so it is the gateway that
    closes an idle connection and a request is not sent on one the server is closing."""
    return outbound_http(
        settings, limits=httpx.Limits(keepalive_expiry=settings.connector_keepalive_expiry_seconds)
    )


def service_tokens(http: httpx.AsyncClient, settings: Settings) -> ClientCredentialsToken:
    """This service's own bearer for ds (docs/wire-contracts.md), each fetch bounded like a call
    to ds; no client configured → no bearer; a failure is `502 ds_unavailable` (`_headers`)."""
    return service_token(http, settings, timeout_s=settings.connector_timeout_seconds)


@dataclass(frozen=True)
class EdrIdentity:
    consumer: str  # verified `aud`
    provider: str | None  # verified `iss`
    base_url: str  # the provider's connector

    def __repr__(self) -> str:
        return f"EdrIdentity(base_url={self.base_url!r})"


def resolve_connector(settings: ConnectorSettings, provider: str | None) -> str:
    try:
        return connector_base(settings, provider)
    except UnroutableProvider:
        raise ServiceError(
            "provider_not_served", "This data plane does not serve the provider that issued the token"
        ) from None
    except ConnectorNotConfigured:
        raise ServiceError(
            "ds_not_configured", "Dataspace mode is enabled but CONNECTOR_INTERNAL_URL is not configured"
        ) from None


class ConnectorClient:
    def __init__(
        self,
        http: httpx.AsyncClient,
        settings: Settings,
        tokens: ClientCredentialsToken,
        edr_refetch_seconds: float = EDR_REFETCH_SECONDS,
        metrics: Metrics | None = None,
    ) -> None:
        self._http = http
        self._settings = settings
        self._tokens = tokens
        self._timeout = settings.connector_timeout_seconds
        self._edr_keys: dict[str, KeySet] = {}  # per connector base
        self._edr_refetch_seconds = edr_refetch_seconds
        self._verified: VerifiedTokens[EdrIdentity] = VerifiedTokens()
        self._decisions = DsDecisionCache(
            settings.ds_decision_cache_maxsize, enabled=settings.ds_decision_cache_enabled, metrics=metrics
        )

    async def _headers(self) -> dict[str, str]:
        try:
            token = await self._tokens.get()
        except TokenUnavailable:
            raise ServiceError("ds_unavailable", "service credentials unavailable") from None
        return {"Authorization": f"Bearer {token}"} if token else {}

    def _key_set(self, base: str) -> KeySet:
        """The connector's EDR keys (docs/gateway.md, "Key sets"): every key a candidate, a JWK
        without `alg` read as ES256, a set without a usable key an error."""
        keys = self._edr_keys.get(base)
        if keys is None:

            async def fetch() -> httpx.Response:
                return await self._http.get(
                    f"{base}/internal/edr-jwks", headers=await self._headers(), timeout=self._timeout
                )

            keys = self._edr_keys[base] = KeySet(
                fetch,
                min_refetch_seconds=self._edr_refetch_seconds,
                match_kid=False,
                default_algorithm="ES256",
                require_keys=True,
            )
        return keys

    async def verify_edr(self, token: str | None) -> EdrIdentity:
        """docs/gateway.md, "EDR token": read `iss` unverified only to choose the connector; verify with every
        key of that connector's set; the verified `aud` is the consumer."""
        if not token:
            raise ServiceError("invalid_token", "Dataspace mode requires the EDR token")
        memo = self._verified.get(token)  # a token that verified, while its key is still held
        if memo is not None:
            held = self._edr_keys.get(memo.value.base_url)
            if held is not None and held.held(memo.key):
                return memo.value
            self._verified.drop(token)
        try:
            unverified = jwt.decode(token, options={"verify_signature": False})
        except jwt.PyJWTError:
            raise ServiceError("invalid_token", "EDR token is not valid") from None
        iss = unverified.get("iss") if isinstance(unverified.get("iss"), str) else None
        base = resolve_connector(self._settings, iss)

        def check(key: jwt.PyJWK) -> dict[str, Any]:
            claims: dict[str, Any] = jwt.decode(
                token, key.key, algorithms=_EDR_ALGORITHMS, options={"verify_aud": False, "verify_exp": False}
            )
            return claims

        try:
            claims, verified_by = await self._key_set(base).verify(None, check)
        except NoUsableKey:
            raise ServiceError("ds_unavailable", "ds published no usable EDR verification key") from None
        except KeySetUnavailable:
            raise ServiceError("ds_unavailable", "ds-connector key set unavailable") from None
        except jwt.PyJWTError:
            raise ServiceError("invalid_token", "EDR token is not valid") from None
        aud: Any = claims.get("aud")
        if isinstance(aud, list):
            aud = aud[0] if aud else None
        if not isinstance(aud, str) or not aud:
            raise ServiceError("invalid_token", "EDR token names no audience")
        provider = claims.get("iss") if isinstance(claims.get("iss"), str) else None
        identity = EdrIdentity(consumer=aud, provider=provider, base_url=base)
        if memoisable(claims):
            # the check ignores exp; the memo still never holds a token past it
            self._verified.put(token, identity, verified_by, exp_of(claims))
        return identity

    async def authorize(self, base: str, request: AuthorizeRequest) -> DecisionEnvelope:
        """One call for every touched dataset; unreachable or erroring → 502 ds_unavailable.

        An identical question asked again within the ttl ds gave its answer is answered from
        this replica's decision cache, without a call. Only a readable answer is kept: every
        failure below raises before `put`, so the next question goes to ds again."""
        key = decision_key(base, request)
        cached = self._decisions.get(key)
        if cached is not None:
            return cached
        asked_at = self._decisions.now()
        headers = await self._headers()
        body = request.model_dump(mode="json")
        for attempt in (1, 2):
            try:
                response = await self._http.post(
                    f"{base}/internal/dataplane/authorize", json=body, headers=headers, timeout=self._timeout
                )
                break
            except _CONNECTION_RESET as exc:
                if attempt == 2:
                    raise ServiceError("ds_unavailable", "ds-connector unreachable") from None
                log.info("ds_authorize_retried", error=type(exc).__name__)
            except httpx.HTTPError:
                raise ServiceError("ds_unavailable", "ds-connector unreachable") from None
        if response.status_code >= 400:
            raise ServiceError("ds_unavailable", f"ds-connector error: {response.status_code}")
        try:
            envelope = DecisionEnvelope.model_validate(response.json())
        except (ValidationError, ValueError):
            raise ServiceError("ds_unavailable", "ds-connector answer unreadable") from None
        self._decisions.put(key, envelope, asked_at)
        return envelope
