"""DPS-02: bearer JWTs checked against the configured OIDC issuer (issuer, audience, signature).

The key set is held as every verifier holds it (docs/gateway.md, "Key sets"): kept for its ttl,
and a token naming a `kid` the set lacks refetches it, at most once per
CELINE_OIDC_JWKS_MIN_REFETCH_SECONDS, so forged kids cannot hammer the issuer. The JWKS URI is
CELINE_OIDC_JWKS_URI, else `{CELINE_OIDC_BASE_URL}/protocol/openid-connect/certs` (Keycloak's),
as the shared OidcSettings mixin resolves it."""

from __future__ import annotations

from typing import Any

import httpx
import jwt

from dataplane_service_kit.jwks import KeySet, KeySetUnavailable, NotSigned

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
        min_refetch_seconds: float = 1.0,
    ) -> None:
        self.issuer = issuer.rstrip("/")
        self.audience = audience
        self._keys = KeySet(
            lambda: http.get(jwks_uri),
            min_refetch_seconds=min_refetch_seconds,
            signing_only=True,
            require_kid=True,
        )

    async def verify(self, token: str) -> dict[str, Any]:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise InvalidToken("malformed token") from exc
        kid = header.get("kid")
        alg = header.get("alg")
        if not isinstance(kid, str) or alg not in ALGORITHMS:
            raise InvalidToken("token header lacks a usable kid/alg")

        def check(key: jwt.PyJWK) -> dict[str, Any]:
            claims: dict[str, Any] = jwt.decode(
                token,
                key=key.key,
                algorithms=[alg],
                audience=self.audience,
                issuer=self.issuer,
                options={"require": ["exp", "iss", "aud"]},
            )
            return claims

        try:
            claims, _ = await self._keys.verify(kid, check)
        except KeySetUnavailable as exc:
            raise InvalidToken("the issuer's key set could not be read") from exc
        except NotSigned as exc:
            raise InvalidToken("unknown signing key") from exc
        except jwt.PyJWTError as exc:
            raise InvalidToken(type(exc).__name__) from exc
        return claims
