"""The one key-set rule every verifier follows (dataplane_service_kit.jwks, docs/gateway.md, "Key
sets"): fetched when first needed and again once older than its ttl; a token no held key signed
refetches at once, then at most once per interval; concurrent tokens share a fetch; a token whose
claims fail never causes one; an unchanged JWK keeps its key object across fetches."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from jwt.algorithms import ECAlgorithm

from dataplane_service_kit.jwks import KeySet, KeySetUnavailable, NotSigned, NoUsableKey

URL = "https://issuer.test/certs"


class Issuer:
    """Publishes the keys it lists, answering each fetch after `delay` seconds; counts fetches."""

    def __init__(self) -> None:
        self.keys: dict[str, ec.EllipticCurvePrivateKey] = {}
        self.published: list[str] = []
        self.fetches = 0
        self.fetched_at: list[float] = []  # time.monotonic() of each fetch
        self.status = 200
        self.delay = 0.0
        self.extra: list[Any] = []

    def add(self, kid: str) -> None:
        self.keys[kid] = ec.generate_private_key(ec.SECP256R1())
        self.published.append(kid)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        self.fetches += 1
        self.fetched_at.append(time.monotonic())
        await asyncio.sleep(self.delay)
        keys: list[Any] = list(self.extra)
        for kid in self.published:
            jwk: dict[str, Any] = ECAlgorithm.to_jwk(self.keys[kid].public_key(), as_dict=True)
            keys.append({**jwk, "kid": kid, "alg": "ES256", "use": "sig"})
        return httpx.Response(self.status, json={"keys": keys})

    def token(self, kid: str, exp_in: int = 600, header_kid: str | None = None) -> str:
        claims = {"sub": "alice", "exp": int(time.time()) + exp_in}
        return jwt.encode(claims, self.keys[kid], algorithm="ES256", headers={"kid": header_kid or kid})


@pytest.fixture
def issuer() -> Issuer:
    issuer = Issuer()
    issuer.add("k1")
    return issuer


def key_set(issuer: Issuer, **options: Any) -> KeySet:
    http = httpx.AsyncClient(transport=httpx.MockTransport(issuer.handle))
    options.setdefault("min_refetch_seconds", 3600.0)
    return KeySet(lambda: http.get(URL), **options)


def checker(token: str) -> Any:
    def check(key: jwt.PyJWK) -> dict[str, Any]:
        claims: dict[str, Any] = jwt.decode(token, key.key, algorithms=["ES256"])
        return claims

    return check


async def verify(keys: KeySet, token: str) -> tuple[dict[str, Any], jwt.PyJWK]:
    kid = jwt.get_unverified_header(token).get("kid")
    return await keys.verify(kid, checker(token))


async def test_concurrent_first_tokens_share_one_fetch(issuer: Issuer) -> None:
    keys = key_set(issuer)
    issuer.delay = 0.05  # the fetch is still running while the others arrive
    answers = await asyncio.gather(*(verify(keys, issuer.token("k1")) for _ in range(8)))
    assert {claims["sub"] for claims, _ in answers} == {"alice"}
    assert issuer.fetches == 1
    await verify(keys, issuer.token("k1"))
    assert issuer.fetches == 1  # a known kid is served from the held set


async def test_an_unknown_kid_refetches_at_once_then_at_most_once_per_interval(issuer: Issuer) -> None:
    keys = key_set(issuer, min_refetch_seconds=0.2)
    await verify(keys, issuer.token("k1"))
    issuer.add("k2")  # rotated right after the first fetch: accepted on its first token
    assert (await verify(keys, issuer.token("k2")))[0]["sub"] == "alice"
    assert issuer.fetches == 2
    # a storm of forged kids inside the interval: they wait for its end and share one refetch
    forged = [verify(keys, issuer.token("k1", header_kid=f"forged-{n}")) for n in range(8)]
    outcomes = await asyncio.gather(*forged, return_exceptions=True)
    assert all(isinstance(o, NotSigned) for o in outcomes)
    assert issuer.fetches == 3
    issuer.add("k3")  # a real rotation inside the next interval is still accepted, one fetch later
    assert (await verify(keys, issuer.token("k3")))[0]["sub"] == "alice"
    assert issuer.fetches == 4


async def test_forged_kids_one_after_another_are_spaced_by_the_interval(issuer: Issuer) -> None:
    interval = 0.2
    keys = key_set(issuer, min_refetch_seconds=interval)
    await verify(keys, issuer.token("k1"))
    for n in range(4):
        with pytest.raises(NotSigned):
            await verify(keys, issuer.token("k1", header_kid=f"forged-{n}"))
    refetches = issuer.fetched_at[1:]
    assert len(refetches) == 4
    gaps = [later - earlier for earlier, later in itertools.pairwise(refetches)]
    # the event loop may wake a sleeper up to its clock resolution early
    assert all(gap >= interval - 0.02 for gap in gaps), gaps


async def test_a_known_kid_whose_key_does_not_verify_causes_no_fetch(issuer: Issuer) -> None:
    keys = key_set(issuer, min_refetch_seconds=0.0)
    await verify(keys, issuer.token("k1"))
    issuer.keys["k1"] = ec.generate_private_key(ec.SECP256R1())  # signs, but is not the published key
    with pytest.raises(NotSigned):
        await verify(keys, issuer.token("k1"))
    assert issuer.fetches == 1


async def test_tokens_that_waited_for_a_failed_refetch_fail_with_it(issuer: Issuer) -> None:
    keys = key_set(issuer, min_refetch_seconds=0.0)
    await verify(keys, issuer.token("k1"))
    issuer.status, issuer.delay = 503, 0.05
    outcomes = await asyncio.gather(
        *(verify(keys, issuer.token("k1", header_kid="new")) for _ in range(5)), return_exceptions=True
    )
    assert all(isinstance(o, KeySetUnavailable) for o in outcomes)
    assert issuer.fetches == 2  # one refetch, failed, shared by all five


async def test_with_no_interval_every_unknown_kid_refetches(issuer: Issuer) -> None:
    keys = key_set(issuer, min_refetch_seconds=0.0)
    await verify(keys, issuer.token("k1"))
    for n in (2, 3):
        issuer.add(f"k{n}")
        await verify(keys, issuer.token(f"k{n}"))
    assert issuer.fetches == 3


async def test_concurrent_tokens_of_a_new_kid_share_one_refetch(issuer: Issuer) -> None:
    keys = key_set(issuer, min_refetch_seconds=0.0)
    await verify(keys, issuer.token("k1"))
    issuer.add("k2")
    issuer.delay = 0.05
    await asyncio.gather(*(verify(keys, issuer.token("k2")) for _ in range(6)))
    assert issuer.fetches == 2


async def test_a_token_whose_claims_fail_causes_no_fetch(issuer: Issuer) -> None:
    keys = key_set(issuer, min_refetch_seconds=0.0)
    await verify(keys, issuer.token("k1"))
    for _ in range(3):
        with pytest.raises(jwt.ExpiredSignatureError):
            await verify(keys, issuer.token("k1", exp_in=-60))
    assert issuer.fetches == 1


async def test_the_set_is_fetched_again_once_older_than_its_ttl(issuer: Issuer) -> None:
    keys = key_set(issuer, ttl_seconds=0.0)
    _, key = await verify(keys, issuer.token("k1"))
    assert not keys.held(key)  # past its ttl: a memo must not serve a token of it any more
    issuer.published = []  # k1 removed at the issuer
    with pytest.raises(NotSigned):
        await verify(keys, issuer.token("k1"))
    assert issuer.fetches >= 2


async def test_an_unchanged_key_keeps_its_object_across_a_refetch(issuer: Issuer) -> None:
    keys = key_set(issuer, min_refetch_seconds=0.0)
    _, k1 = await verify(keys, issuer.token("k1"))
    issuer.add("k2")
    await verify(keys, issuer.token("k2"))  # a refetch that kept k1
    assert issuer.fetches == 2
    assert keys.held(k1)
    _, again = await verify(keys, issuer.token("k1"))
    assert again is k1
    issuer.published = ["k2"]  # k1 retired: the next refetch drops it
    issuer.add("k3")
    await verify(keys, issuer.token("k3"))
    assert not keys.held(k1)


async def test_every_key_is_a_candidate_when_kids_are_not_matched(issuer: Issuer) -> None:
    issuer.add("k2")
    keys = key_set(issuer, match_kid=False)
    token = issuer.token("k2", header_kid="whatever")
    claims, key = await keys.verify(None, checker(token))
    assert claims["sub"] == "alice"
    assert key is not (await keys.verify(None, checker(issuer.token("k1"))))[1]


async def test_an_unreadable_set_is_unavailable_and_an_empty_one_where_keys_are_required(
    issuer: Issuer,
) -> None:
    issuer.status = 503
    with pytest.raises(KeySetUnavailable):
        await verify(key_set(issuer), issuer.token("k1"))
    issuer.status = 200
    issuer.published = []
    issuer.extra = [{"kty": "EC", "crv": "P-256", "x": "not-a-point"}, "not-a-jwk"]  # skipped
    with pytest.raises(NoUsableKey):
        await verify(key_set(issuer, require_keys=True), issuer.token("k1"))
    with pytest.raises(NotSigned):
        await verify(key_set(issuer), issuer.token("k1"))


async def test_keys_not_for_signing_or_without_kid_are_skipped_where_asked(issuer: Issuer) -> None:
    jwk: dict[str, Any] = ECAlgorithm.to_jwk(issuer.keys["k1"].public_key(), as_dict=True)
    issuer.published = []
    issuer.extra = [{**jwk, "kid": "k1", "use": "enc"}, {**jwk}]
    with pytest.raises(NotSigned):
        await verify(key_set(issuer, signing_only=True, require_kid=True), issuer.token("k1"))
    # the same document without the restrictions: the `kid` "k1" key verifies
    assert (await verify(key_set(issuer), issuer.token("k1")))[0]["sub"] == "alice"
