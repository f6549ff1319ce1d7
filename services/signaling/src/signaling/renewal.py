"""http-pull token renewal (`POST {refreshEndpoint}`, the OAuth 2.0 refresh_token grant).

The client authenticates with a bearer JWT signed by a key of its did:web document: `iss` = `sub` =
its DID, which must be the flow's counter-party; `aud` = the flow's provider; `jti` never seen
before; `iat`, `exp`; `token` = the access token paired with the presented refresh token.

Rotation: a renewal issues a new pair held as *pending*. The old pair stays valid until the new
access token is first used (the gateway calls `dps_pull_token_used`) or the new refresh token is
presented; then the old pair is dead. Renewing again with the old refresh token before that
replaces the pending pair (a lost answer can be retried). Every refusal is a ServiceError, rendered
and audited by app.py, and happens before anything is written: the transaction rolls back."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec
from sqlalchemy.ext.asyncio import AsyncEngine

from dataplane_contracts.dps import PULL_TOKEN_ALGORITHM, FlowState
from dataplane_service_kit.errors import ServiceError
from signaling import repository
from signaling.did_web import DidUnresolvable, DidWebResolver, KeyNotFound
from signaling.metrics import Metrics
from signaling.tokens import PullTokenSigner, refresh_hash

CLIENT_JWT_ALGORITHMS = ["ES256"]
# a client JWT may live at most this long (the replay store keeps its id that long)
MAX_CLIENT_JWT_LIFETIME_S = 3600
CLOCK_LEEWAY_S = 30


@dataclass(frozen=True)
class RenewedTokens:
    access_token: str
    refresh_token: str
    expires_in: int

    def wire(self) -> dict[str, Any]:
        """RFC 6749 section 5.1."""
        return {
            "access_token": self.access_token,
            "token_type": "Bearer",
            "expires_in": self.expires_in,
            "refresh_token": self.refresh_token,
        }


def _client_invalid(detail: str) -> ServiceError:
    return ServiceError("client_jwt_invalid", detail)


def _single(aud: object) -> str | None:
    if isinstance(aud, str):
        return aud
    if isinstance(aud, list) and len(aud) == 1 and isinstance(aud[0], str):
        return aud[0]
    return None


class TokenRenewal:
    def __init__(
        self,
        engine: AsyncEngine,
        signer: PullTokenSigner,
        verifying_key: ec.EllipticCurvePublicKey,
        resolver: DidWebResolver,
        *,
        metrics: Metrics,
        on_commit: Callable[[], None] = lambda: None,
    ) -> None:
        self._engine = engine
        self._signer = signer
        self._own_key = verifying_key
        self._resolver = resolver
        self._metrics = metrics
        self._on_commit = on_commit

    @staticmethod
    def _form(form: Mapping[str, list[str]]) -> str:
        grant = form.get("grant_type", [])
        if grant != ["refresh_token"]:
            raise ServiceError("unsupported_grant_type", "only grant_type=refresh_token is served")
        token = form.get("refresh_token", [])
        if len(token) != 1 or not token[0]:
            raise ServiceError("invalid_refresh_request", "exactly one refresh_token is required")
        return token[0]

    @staticmethod
    def _unverified(client_jwt: str) -> tuple[str, str]:
        """(iss, kid) of a client JWT before anything is fetched: ES256, `kid` = `<iss>#<key-id>`."""
        try:
            header = jwt.get_unverified_header(client_jwt)
            unverified = jwt.decode(client_jwt, options={"verify_signature": False})
        except jwt.PyJWTError:
            raise _client_invalid("the client JWT is malformed") from None
        if header.get("alg") not in CLIENT_JWT_ALGORITHMS:
            raise _client_invalid("the client JWT must be signed with ES256")
        did, kid = unverified.get("iss"), header.get("kid")
        if not isinstance(did, str) or not isinstance(kid, str) or kid.partition("#")[0] != did:
            raise _client_invalid("kid must be <iss>#<key-id>")
        return did, kid

    async def _client(self, client_jwt: str, did: str, kid: str) -> dict[str, Any]:
        """The client JWT's claims once signed by the key its `kid` names in the DID document of
        its `iss`. Audience and the `token` claim are judged against the flow afterwards."""
        try:
            key = await self._resolver.key(kid)
        except DidUnresolvable:
            raise ServiceError("client_did_unresolvable", "the client's DID cannot be resolved") from None
        except KeyNotFound:
            raise _client_invalid("the DID document has no such key") from None
        try:
            claims: dict[str, Any] = jwt.decode(
                client_jwt,
                key,
                algorithms=CLIENT_JWT_ALGORITHMS,
                leeway=CLOCK_LEEWAY_S,
                options={"verify_aud": False, "require": ["iss", "sub", "aud", "jti", "iat", "exp", "token"]},
            )
        except jwt.PyJWTError:
            raise _client_invalid("the client JWT does not verify") from None
        if (
            claims["iss"] != did
            or claims["sub"] != did
            or not isinstance(claims["jti"], str)
            or not claims["jti"]
        ):
            raise _client_invalid("sub must equal iss, and jti must be a string")
        if not isinstance(claims["iat"], int) or not isinstance(claims["exp"], int):
            raise _client_invalid("iat and exp must be integers")
        if claims["exp"] - claims["iat"] > MAX_CLIENT_JWT_LIFETIME_S:
            raise _client_invalid("the client JWT lives too long")
        return claims

    def _presented_access_id(self, token: object) -> str | None:
        """The id of the access token the client says it holds (ours; its exp may have passed)."""
        if not isinstance(token, str):
            return None
        try:
            claims = jwt.decode(
                token,
                self._own_key,
                algorithms=[PULL_TOKEN_ALGORITHM],
                options={"verify_aud": False, "verify_exp": False, "require": ["jti"]},
            )
        except jwt.PyJWTError:
            return None
        jti = claims.get("jti")
        return jti if isinstance(jti, str) else None

    async def renew(
        self, form: Mapping[str, list[str]], client_jwt: str | None, identified: Callable[[str], None]
    ) -> RenewedTokens:
        """The refresh token is looked up before any DID is resolved, and only the flow's own
        counter-party's document is ever fetched: a caller without a live refresh token cannot make
        this service fetch a URL of its choosing. The fetch happens outside any transaction; the
        flow is then locked and read again, so a signal committed meanwhile decides."""
        refresh_token = self._form(form)
        if not client_jwt:
            raise ServiceError("client_auth_required", "renewal requires the client's bearer JWT")
        did, kid = self._unverified(client_jwt)
        digest = refresh_hash(refresh_token)
        async with self._engine.connect() as conn:
            seen = await repository.flow_by_refresh(conn, digest, lock=False)
        if seen is None or seen[0].state is not FlowState.STARTED:
            raise ServiceError("refresh_token_invalid", "the refresh token is not live")
        if did != seen[0].counter_party_id:
            raise ServiceError("client_not_counter_party", "the client is not this flow's counter-party")
        client = await self._client(client_jwt, did, kid)
        identified(did)  # verified: the audit record names the client from here on
        async with self._engine.begin() as conn:
            found = await repository.flow_by_refresh(conn, digest, lock=True)
            if found is None or found[0].state is not FlowState.STARTED:
                raise ServiceError("refresh_token_invalid", "the refresh token is not live")
            flow, pair = found
            if _single(client["aud"]) != flow.participant_id:
                raise ServiceError("client_audience", "the client JWT is not addressed to this provider")
            if self._presented_access_id(client["token"]) != pair.access_id:
                raise _client_invalid("the token claim is not the access token of this refresh token")
            expires = datetime.fromtimestamp(client["exp"] + CLOCK_LEEWAY_S, UTC)
            if not await repository.remember_client_jti(conn, did, client["jti"], expires):
                raise ServiceError("client_jwt_replayed", "this client JWT was used before")
            new = self._signer.issue_pair(
                flow.id, flow.participant_id, flow.counter_party_id, flow.dataset_id, flow.agreement_id
            )
            values: dict[str, Any] = {
                "pending_token_id": new.access_id,
                "pending_refresh_hash": new.refresh_hash,
            }
            if pair.pending:
                # the new refresh token presented: its pair is in use, the one before it is dead
                values |= {"token_id": pair.access_id, "refresh_hash": digest}
            await repository.update_flow(conn, flow.id, values)
        self._on_commit()
        self._metrics.tokens_issued.inc()
        return RenewedTokens(new.access_token, new.refresh_token, new.expires_in)
