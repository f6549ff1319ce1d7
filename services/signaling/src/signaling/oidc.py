"""DPS-02: bearer JWTs checked against the configured OIDC issuer (issuer, audience, signature).

The key set is cached; a token naming a `kid` the cache lacks triggers one refetch (rate-limited
by CELINE_OIDC_JWKS_MIN_REFETCH_SECONDS so forged kids cannot hammer the issuer). The JWKS URI is
CELINE_OIDC_JWKS_URI, else `{CELINE_OIDC_BASE_URL}/protocol/openid-connect/certs` (Keycloak's),
as the shared OidcSettings mixin resolves it."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import jwt
from jwt import PyJWK

ALGORITHMS = ["RS256", "RS384", "RS512", "ES256", "ES384", "ES512", "PS256", "PS384", "PS512", "EdDSA"]


class InvalidToken(Exception):
    """The token is not valid; the message is safe to log (no token content)."""


class JwtVerifier:
    def __init__(
        self,
        http: httpx.AsyncClient,
        issuer: str,
        audience: str,
        jwks_uri: str,
        min_refetch_seconds: float = 10.0,
    ) -> None:
        self._http = http
        self.issuer = issuer.rstrip("/")
        self.audience = audience
        self._jwks_uri = jwks_uri
        self._min_refetch = min_refetch_seconds
        self._keys: dict[str, PyJWK] = {}
        self._fetched_at: float | None = None
        self._lock = asyncio.Lock()

    async def _fetch(self) -> None:
        resp = await self._http.get(self._jwks_uri)
        resp.raise_for_status()
        keys: dict[str, PyJWK] = {}
        for raw in resp.json().get("keys", []):
            if raw.get("use", "sig") != "sig" or "kid" not in raw:
                continue
            try:
                keys[raw["kid"]] = PyJWK.from_dict(raw)
            except jwt.PyJWTError:
                continue  # a key type we cannot use is simply not a candidate
        self._keys = keys
        self._fetched_at = time.monotonic()

    async def _key(self, kid: str) -> PyJWK:
        if kid in self._keys:
            return self._keys[kid]
        async with self._lock:
            if kid in self._keys:
                return self._keys[kid]
            recent = self._fetched_at is not None and (
                time.monotonic() - self._fetched_at < self._min_refetch
            )
            if not recent:
                try:
                    await self._fetch()
                except (httpx.HTTPError, ValueError, KeyError, AttributeError) as exc:
                    raise InvalidToken("the issuer's key set could not be read") from exc
        if kid not in self._keys:
            raise InvalidToken("unknown signing key")
        return self._keys[kid]

    async def verify(self, token: str) -> dict[str, Any]:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise InvalidToken("malformed token") from exc
        kid = header.get("kid")
        alg = header.get("alg")
        if not isinstance(kid, str) or alg not in ALGORITHMS:
            raise InvalidToken("token header lacks a usable kid/alg")
        key = await self._key(kid)
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key=key.key,
                algorithms=[alg],
                audience=self.audience,
                issuer=self.issuer,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.PyJWTError as exc:
            raise InvalidToken(type(exc).__name__) from exc
        return claims
