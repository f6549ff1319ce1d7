"""Tokens this data plane signs: DPS-06 pull tokens (ES256, claims jti/aud/iss=sub/iat, no exp,
no flow facts) and the http-pull profile's access tokens (ES256, expiring, with the flow's facts)
with their opaque refresh tokens, of which only a hash is ever stored."""

from __future__ import annotations

import hashlib
import secrets
import time
import uuid
from dataclasses import dataclass

import jwt
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from dataplane_contracts.dps import PULL_TOKEN_ALGORITHM, AccessTokenClaims, PullTokenClaims


def refresh_hash(refresh_token: str) -> str:
    """What is stored for a refresh token: its SHA-256. The token is 256 random bits, so a plain
    digest cannot be reversed or guessed from the database."""
    return hashlib.sha256(refresh_token.encode()).hexdigest()


@dataclass(frozen=True)
class TokenPair:
    """An http-pull access token and its refresh token, as handed out once (never stored)."""

    access_token: str
    access_id: str
    refresh_token: str
    expires_in: int

    @property
    def refresh_hash(self) -> str:
        return refresh_hash(self.refresh_token)


class PullTokenSigner:
    """Signs pull tokens with the configured key; every replica must hold the same key."""

    def __init__(
        self, key: ec.EllipticCurvePrivateKey, key_id: str | None = None, ttl_seconds: int = 300
    ) -> None:
        self._key = key
        self._kid = key_id
        self._ttl = ttl_seconds

    def _sign(self, claims: dict[str, object]) -> str:
        headers = {"kid": self._kid} if self._kid else None
        return jwt.encode(claims, self._key, algorithm=PULL_TOKEN_ALGORITHM, headers=headers)

    def issue(self, participant_id: str, counter_party_id: str) -> tuple[str, PullTokenClaims]:
        claims = PullTokenClaims(
            jti=str(uuid.uuid4()),
            iss=participant_id,
            sub=participant_id,
            aud=counter_party_id,
            iat=int(time.time()),
        )
        return self._sign(claims.model_dump()), claims

    def issue_pair(
        self, flow_id: str, participant_id: str, counter_party_id: str, dataset_id: str, agreement_id: str
    ) -> TokenPair:
        """An http-pull access token (sub = the counter-party who holds it, aud = the provider
        whose data plane serves it) living DPS_TOKEN_TTL_SECONDS, and a fresh refresh token."""
        now = int(time.time())
        claims = AccessTokenClaims.model_validate(
            {
                "jti": str(uuid.uuid4()),
                "iss": participant_id,
                "sub": counter_party_id,
                "aud": participant_id,
                "iat": now,
                "exp": now + self._ttl,
                "dataFlowId": flow_id,
                "datasetId": dataset_id,
                "agreementId": agreement_id,
            }
        )
        return TokenPair(
            access_token=self._sign(claims.wire()),
            access_id=claims.jti,
            refresh_token=secrets.token_urlsafe(32),
            expires_in=self._ttl,
        )


def public_key_pem(key: ec.EllipticCurvePrivateKey) -> str:
    """What the gateway is configured with (`DPS_TOKEN_PUBLIC_KEY`)."""
    return key.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo).decode()
