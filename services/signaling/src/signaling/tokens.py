"""DPS-06 pull tokens: ES256, claims jti/aud/iss=sub/iat, no exp, no flow facts."""

from __future__ import annotations

import time
import uuid

import jwt
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from dataplane_contracts.dps import PULL_TOKEN_ALGORITHM, PullTokenClaims


class PullTokenSigner:
    """Signs pull tokens with the configured key; every replica must hold the same key."""

    def __init__(self, key: ec.EllipticCurvePrivateKey, key_id: str | None = None) -> None:
        self._key = key
        self._kid = key_id

    def issue(self, participant_id: str, counter_party_id: str) -> tuple[str, PullTokenClaims]:
        claims = PullTokenClaims(
            jti=str(uuid.uuid4()),
            iss=participant_id,
            sub=participant_id,
            aud=counter_party_id,
            iat=int(time.time()),
        )
        headers = {"kid": self._kid} if self._kid else None
        token = jwt.encode(claims.model_dump(), self._key, algorithm=PULL_TOKEN_ALGORITHM, headers=headers)
        return token, claims


def public_key_pem(key: ec.EllipticCurvePrivateKey) -> str:
    """What the gateway is configured with (`DPS_TOKEN_PUBLIC_KEY`)."""
    return key.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo).decode()
