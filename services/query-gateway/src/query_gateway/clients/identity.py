"""The normal path's caller: an OIDC bearer verified against the issuer's JWKS (docs/gateway.md,
"Key sets"), normalised as docs/gateway.md, "Identity". A bearer that verified is
memoised until its `exp` while its key stays in the set (query_gateway.clients.verified)."""

from __future__ import annotations

from typing import Any

import httpx
import jwt

from dataplane_service_kit.errors import ServiceError
from dataplane_service_kit.jwks import KeySet, KeySetUnavailable
from query_gateway.clients.verified import VerifiedTokens, exp_of, memoisable
from query_gateway.rules.caller import Caller, OrgMembership

_ALGORITHMS = ["RS256", "ES256", "RS384", "ES384", "RS512", "PS256"]
_MIN_REFETCH_SECONDS = 1.0  # an unknown kid refetches at most this often (no fetch storms)


def _str_list(raw: object) -> list[str]:
    if isinstance(raw, str):
        return [raw]
    if isinstance(raw, list):
        return [x for x in raw if isinstance(x, str)]
    return []


def _organizations(claim: object) -> tuple[OrgMembership, ...]:
    """`organization: {alias: {type|attributes.type, groups: ["/viewers"]}}`; leading `/` stripped."""
    if not isinstance(claim, dict):
        return ()
    out = []
    for alias, raw in sorted(claim.items()):
        if not isinstance(alias, str) or not alias:
            continue
        body = raw if isinstance(raw, dict) else {}
        types_raw = body.get("type", body.get("types"))
        attributes = body.get("attributes")
        if types_raw is None and isinstance(attributes, dict):
            types_raw = attributes.get("type", attributes.get("types"))
        groups = sorted({g.lstrip("/") for g in _str_list(body.get("groups")) if g.lstrip("/")})
        out.append(OrgMembership(alias, tuple(_str_list(types_raw)), tuple(groups)))
    return tuple(out)


def normalise(claims: dict[str, Any], token: str) -> Caller:
    """docs/gateway.md, "Identity": roles only from realm_access.roles; groups only inside organizations."""
    username = claims.get("preferred_username") or claims.get("email")
    realm = claims.get("realm_access")
    roles = frozenset(_str_list(realm.get("roles")) if isinstance(realm, dict) else [])
    scope = claims.get("scope")
    service = (isinstance(username, str) and username.startswith("service-account-")) or claims.get(
        "gty"
    ) == "client-credentials"
    exp = claims.get("exp")
    client_id = claims.get("azp") or claims.get("client_id")
    return Caller(
        sub=claims.get("sub") if isinstance(claims.get("sub"), str) else None,
        username=username if isinstance(username, str) else None,
        email=claims.get("email") if isinstance(claims.get("email"), str) else None,
        client_id=client_id if isinstance(client_id, str) else None,
        roles=roles,
        scopes=frozenset(scope.split()) if isinstance(scope, str) else frozenset(),
        service_account=bool(service),
        orgs=_organizations(claims.get("organization")),
        exp=exp if isinstance(exp, int) else None,
        token=token,
    )


class OidcVerifier:
    """The issuer's key set (dataplane_service_kit.jwks: fetched lazily, kept for its ttl,
    refetched on an unknown `kid` at most once per second) and the memo of verified bearers."""

    def __init__(
        self, http: httpx.AsyncClient, jwks_uri: str | None, issuer: str | None, audience: str | None
    ) -> None:
        self._jwks_uri = jwks_uri
        self._issuer = issuer
        self._audience = audience
        self._keys = KeySet(
            lambda: http.get(jwks_uri or "", timeout=5.0), min_refetch_seconds=_MIN_REFETCH_SECONDS
        )
        self._verified: VerifiedTokens[Caller] = VerifiedTokens()

    def _claims(self, token: str, key: jwt.PyJWK) -> dict[str, Any]:
        claims: dict[str, Any] = jwt.decode(
            token,
            key.key,
            algorithms=_ALGORITHMS,
            audience=self._audience,
            issuer=self._issuer,
            options={"verify_aud": self._audience is not None, "require": ["exp"]},
        )
        return claims

    async def verify(self, token: str) -> Caller:
        """401 invalid_token for anything but a token this issuer signed for this audience."""
        if self._jwks_uri is None:
            raise ServiceError("invalid_token", "bearer tokens cannot be verified: no issuer configured")
        memo = self._verified.get(token)  # never past the token's exp (query_gateway.clients.verified)
        if memo is not None:
            if self._keys.held(memo.key):
                return memo.value
            self._verified.drop(token)
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise ServiceError("invalid_token", "bearer token is not valid") from None
        kid = header.get("kid") if isinstance(header.get("kid"), str) else None
        try:
            claims, key = await self._keys.verify(kid, lambda k: self._claims(token, k))
        except KeySetUnavailable:
            raise ServiceError("invalid_token", "bearer token cannot be verified now") from None
        except jwt.PyJWTError:
            raise ServiceError("invalid_token", "bearer token is not valid") from None
        caller = normalise(claims, token)
        if memoisable(claims):
            self._verified.put(token, caller, key, exp_of(claims))
        return caller
