"""The verified-token memo (query_gateway.clients.verified) changes no outcome: a memoised bearer is never
served at or after its exp, nor once the key that verified it has left the key set; `exp` is read
as PyJWT reads it. The same for an EDR token and its ds key set."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from jwt.algorithms import ECAlgorithm

from dataplane_service_kit.errors import ServiceError
from dataplane_service_kit.oauth import ClientCredentialsToken
from query_gateway.clients import verified
from query_gateway.clients.identity import OidcVerifier
from query_gateway.clients.verified import VerifiedTokens, exp_of, memoisable

ISSUER = "https://issuer.test/realms/x"
AUDIENCE = "dataplane"
JWKS = "https://issuer.test/certs"


class Issuer:
    def __init__(self) -> None:
        self.keys: dict[str, ec.EllipticCurvePrivateKey] = {}
        self.published: list[str] = []
        self.fetches = 0

    def add(self, kid: str) -> None:
        self.keys[kid] = ec.generate_private_key(ec.SECP256R1())
        self.published.append(kid)

    def jwks(self, request: httpx.Request) -> httpx.Response:
        self.fetches += 1
        keys = []
        for kid in self.published:
            jwk: dict[str, Any] = ECAlgorithm.to_jwk(self.keys[kid].public_key(), as_dict=True)
            keys.append({**jwk, "kid": kid, "alg": "ES256", "use": "sig"})
        return httpx.Response(200, json={"keys": keys})

    def token(self, kid: str, exp: Any, sub: str = "alice") -> str:
        claims = {"sub": sub, "iss": ISSUER, "aud": AUDIENCE, "exp": exp}
        return jwt.encode(claims, self.keys[kid], algorithm="ES256", headers={"kid": kid})


@pytest.fixture
def issuer() -> Issuer:
    issuer = Issuer()
    issuer.add("k1")
    return issuer


def _verifier(issuer: Issuer) -> OidcVerifier:
    http = httpx.AsyncClient(transport=httpx.MockTransport(issuer.jwks))
    return OidcVerifier(http, JWKS, ISSUER, AUDIENCE)


def test_exp_is_read_as_pyjwt_reads_it() -> None:
    assert exp_of({"exp": 10}) == 10
    assert exp_of({"exp": 10.9}) == 10  # int(), as PyJWT compares it
    assert exp_of({"exp": "12"}) == 12  # PyJWT accepts a numeric string: so must the memo's bound
    assert exp_of({}) is None and memoisable({})
    assert exp_of({"exp": "soon"}) is None and not memoisable({"exp": "soon"})
    assert not memoisable({"exp": float("inf")})


def test_an_entry_is_not_served_at_or_after_its_exp(monkeypatch: pytest.MonkeyPatch) -> None:
    memo: VerifiedTokens[str] = VerifiedTokens()
    memo.put("t", "caller", key=object(), exp=1000)
    monkeypatch.setattr(verified.time, "time", lambda: 999.5)
    assert memo.get("t") is not None
    monkeypatch.setattr(verified.time, "time", lambda: 1000.0)  # exp <= now: expired, as PyJWT says
    assert memo.get("t") is None
    assert len(memo) == 0


def test_the_memo_is_bounded() -> None:
    memo: VerifiedTokens[int] = VerifiedTokens(size=2)
    for i in range(3):
        memo.put(f"t{i}", i, key=None, exp=None)
    assert memo.get("t0") is None and memo.get("t2") is not None and len(memo) == 2


async def test_a_memoised_bearer_is_refused_from_its_exp_on(issuer: Issuer) -> None:
    oidc = _verifier(issuer)
    exp = int(time.time()) + 1
    token = issuer.token("k1", exp)
    first = await oidc.verify(token)
    assert await oidc.verify(token) is first  # served from the memo
    await asyncio.sleep(max(0.0, exp - time.time()) + 0.05)  # past exp by the wall clock
    with pytest.raises(ServiceError) as err:
        await oidc.verify(token)
    assert err.value.code == "invalid_token"


async def test_a_memoised_bearer_is_refused_once_its_key_left_the_set(issuer: Issuer) -> None:
    oidc = _verifier(issuer)
    old = issuer.token("k1", int(time.time()) + 600)
    assert (await oidc.verify(old)).sub == "alice"
    issuer.add("k2")
    issuer.published = ["k2"]  # k1 retired: a token of the new kid makes the gateway refetch
    assert (await oidc.verify(issuer.token("k2", int(time.time()) + 600, sub="bob"))).sub == "bob"
    with pytest.raises(ServiceError) as err:
        await oidc.verify(old)
    assert err.value.code == "invalid_token"


async def test_a_refused_bearer_is_not_memoised(issuer: Issuer) -> None:
    oidc = _verifier(issuer)
    expired = issuer.token("k1", int(time.time()) - 5)
    for _ in range(2):
        with pytest.raises(ServiceError):
            await oidc.verify(expired)
    assert issuer.fetches == 1


class Connector:
    """A ds connector's EDR key set (`/internal/edr-jwks`), rotatable."""

    def __init__(self) -> None:
        self.keys: dict[str, ec.EllipticCurvePrivateKey] = {}
        self.published: list[str] = []

    def add(self, kid: str) -> None:
        self.keys[kid] = ec.generate_private_key(ec.SECP256R1())
        self.published.append(kid)

    def jwks(self, request: httpx.Request) -> httpx.Response:
        keys = []
        for kid in self.published:
            jwk: dict[str, Any] = ECAlgorithm.to_jwk(self.keys[kid].public_key(), as_dict=True)
            keys.append({**jwk, "kid": kid, "alg": "ES256"})
        return httpx.Response(200, json={"keys": keys})

    def edr(self, kid: str, consumer: str) -> str:
        claims = {"iss": "did:web:provider.test", "aud": consumer}
        return jwt.encode(claims, self.keys[kid], algorithm="ES256", headers={"kid": kid})


async def test_a_memoised_edr_token_is_refused_once_its_key_left_the_set() -> None:
    from query_gateway.clients.connector import ConnectorClient
    from query_gateway.settings import Settings

    ds = Connector()
    ds.add("e1")
    http = httpx.AsyncClient(transport=httpx.MockTransport(ds.jwks))
    settings = Settings.model_construct(
        connector_internal_url="http://ds.test", connector_internal_urls={}, connector_timeout_seconds=5.0
    )
    tokens = ClientCredentialsToken(http, token_url=None, client_id=None, client_secret=None)
    client = ConnectorClient(http, settings, tokens)
    old = ds.edr("e1", "did:web:consumer-a.test")
    first = await client.verify_edr(old)
    assert await client.verify_edr(old) is first  # served from the memo
    ds.add("e2")
    ds.published = ["e2"]  # e1 retired; a token of e2 fails on the held set and refreshes it
    assert (await client.verify_edr(ds.edr("e2", "did:web:consumer-b.test"))).consumer.endswith("b.test")
    with pytest.raises(ServiceError) as err:
        await client.verify_edr(old)
    assert err.value.code == "invalid_token"
