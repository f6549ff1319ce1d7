"""One JSON Web Key Set, held the same way by every verifier (the gateway's OIDC bearers and EDR
tokens, signaling's control-plane bearers; docs/gateway.md, "Key sets").

The rule, one for all of them:

- the set is fetched when a token first needs it and kept for `ttl_seconds`; the first token
  after that fetches it again (a key the issuer removed stops verifying within the ttl);
- a token naming a `kid` the set lacks (where every key is a candidate: one no held key signed)
  refetches the set, at most once per `min_refetch_seconds`: the first at once, one inside the
  interval waits for its end and shares the refetch then made. Forged kids therefore cost the
  issuer one fetch per interval, never a stream, and a rotated key is accepted on its first
  token, at worst one interval late;
- concurrent tokens share one fetch (a refetch that failed fails every token that waited for
  it); a token whose signature verified but whose claims did not (expired, wrong audience), or
  a known `kid` whose key does not verify, never causes one;
- a key whose JWK is unchanged keeps its key object across fetches, so what was verified with it
  (the gateway's memo of verified tokens, which serves an entry only while its key is `held`)
  survives a refetch that did not change the key.

A fetch that fails raises `KeySetUnavailable`; each caller decides what that answers (a 401 for a
bearer, a 502 for ds's EDR keys). Nothing here logs: a token never reaches a log line."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
import jwt

T = TypeVar("T")

DEFAULT_TTL_SECONDS = 300.0

# raised only after the signature verified: the token is wrong, not our key set
_CLAIM_ERRORS: tuple[type[jwt.PyJWTError], ...] = (
    jwt.ExpiredSignatureError,
    jwt.ImmatureSignatureError,
    jwt.InvalidAudienceError,
    jwt.InvalidIssuerError,
    jwt.InvalidIssuedAtError,
    jwt.MissingRequiredClaimError,
    jwt.exceptions.InvalidSubjectError,
    jwt.exceptions.InvalidJTIError,
)


class KeySetUnavailable(Exception):
    """The set could not be read: unreachable, an error status, an unreadable document."""


class NoUsableKey(KeySetUnavailable):
    """The set was read but holds no key this verifier can use (only where one is required)."""


class NotSigned(jwt.InvalidSignatureError):
    """No held key signed the token, even after the refetch the rule allowed."""


@dataclass(frozen=True)
class _Held:
    by_kid: dict[str, jwt.PyJWK]
    anonymous: tuple[jwt.PyJWK, ...]  # keys published without a `kid`
    every: tuple[jwt.PyJWK, ...]
    ids: frozenset[int]  # id() of each key object: `held` is one set lookup
    by_jwk: dict[str, jwt.PyJWK]  # canonical JWK text → its key object, reused by the next fetch
    fetched_at: float


class KeySet:
    """`fetch` asks for the document (a JWKS: `{"keys": [...]}`) and returns the response.

    `match_kid`: a token's `kid` picks its key (a token without one is tried with the keys
    published without one); otherwise every key is a candidate (ds's EDR keys, docs/gateway.md).
    `signing_only` skips keys whose `use` is not `sig`; `require_kid` skips keys without a `kid`;
    `default_algorithm` is given to a key that names none; `require_keys` makes a set with no
    usable key `NoUsableKey` instead of an empty set."""

    def __init__(
        self,
        fetch: Callable[[], Awaitable[httpx.Response]],
        *,
        min_refetch_seconds: float,
        ttl_seconds: float = DEFAULT_TTL_SECONDS,
        match_kid: bool = True,
        signing_only: bool = False,
        require_kid: bool = False,
        default_algorithm: str | None = None,
        require_keys: bool = False,
    ) -> None:
        self._fetch_document = fetch
        self._min_refetch = min_refetch_seconds
        self._ttl = ttl_seconds
        self._match_kid = match_kid
        self._signing_only = signing_only
        self._require_kid = require_kid
        self._default_algorithm = default_algorithm
        self._require_keys = require_keys
        self._held: _Held | None = None
        self._refetched_at = -math.inf  # the first token of an unknown key refetches at once
        self._refetches = 0  # refetches finished, so a waiting token knows one failed meanwhile
        self._lock = asyncio.Lock()

    # -- what callers ask -----------------------------------------------------------------------
    def held(self, key: object) -> bool:
        """`key` is an object of the current, unexpired set (a memo's shortcut is still valid)."""
        held = self._held
        return held is not None and id(key) in held.ids and time.monotonic() - held.fetched_at < self._ttl

    async def verify(self, kid: str | None, check: Callable[[jwt.PyJWK], T]) -> tuple[T, jwt.PyJWK]:
        """The first candidate key `check` accepts, with `check`'s answer.

        `check` decodes the token with one key and raises `jwt.PyJWTError` when it does not
        verify. Raises the error of a key that signed the token but whose claims failed, else
        `NotSigned` (after the refetch the rule allows), or `KeySetUnavailable`."""
        held = await self._current()
        outcome = self._first(held, kid, check)
        if isinstance(outcome, tuple):
            return outcome
        if outcome is not None:
            raise outcome
        if self._match_kid and (kid is None or kid in held.by_kid):
            raise NotSigned("the key of this kid did not verify the token")
        newer = await self._refetched(held)
        if newer is not held:
            outcome = self._first(newer, kid, check)
            if isinstance(outcome, tuple):
                return outcome
            if outcome is not None:
                raise outcome
        raise NotSigned("no held key signed the token")

    # -- the rule ---------------------------------------------------------------------------------
    def _candidates(self, held: _Held, kid: str | None) -> Sequence[jwt.PyJWK]:
        if not self._match_kid:
            return held.every
        if kid is None:
            return held.anonymous
        key = held.by_kid.get(kid)
        return (key,) if key is not None else ()

    def _first(
        self, held: _Held, kid: str | None, check: Callable[[jwt.PyJWK], T]
    ) -> tuple[T, jwt.PyJWK] | jwt.PyJWTError | None:
        """The accepted (answer, key); or the claims error of a key that signed; or None."""
        for key in self._candidates(held, kid):
            try:
                return check(key), key
            except _CLAIM_ERRORS as exc:
                return exc
            except jwt.PyJWTError:
                continue
        return None

    async def _current(self) -> _Held:
        held = self._held
        if held is not None and time.monotonic() - held.fetched_at < self._ttl:
            return held
        async with self._lock:
            held = self._held  # a concurrent first use may have fetched it meanwhile
            if held is not None and time.monotonic() - held.fetched_at < self._ttl:
                return held
            return await self._fetch()

    async def _refetched(self, seen: _Held) -> _Held:
        arrived = self._refetches
        async with self._lock:
            held = self._held
            if held is not None and held is not seen:
                return held  # fetched since this token looked: use that one
            if self._refetches != arrived:
                raise KeySetUnavailable("the key set could not be read")  # the shared refetch failed
            wait = self._refetched_at + self._min_refetch - time.monotonic()
            if wait > 0:
                # under the lock: the tokens queued behind this one take the set it fetches
                await asyncio.sleep(wait)
            self._refetched_at = time.monotonic()  # before the fetch: a failing one counts too
            try:
                return await self._fetch()
            finally:
                self._refetches += 1

    async def _fetch(self) -> _Held:
        try:
            response = await self._fetch_document()
            response.raise_for_status()
            raw_keys = response.json().get("keys", [])
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            raise KeySetUnavailable("the key set could not be read") from exc
        previous = self._held.by_jwk if self._held is not None else {}
        by_kid: dict[str, jwt.PyJWK] = {}
        anonymous: list[jwt.PyJWK] = []
        every: list[jwt.PyJWK] = []
        by_jwk: dict[str, jwt.PyJWK] = {}
        for raw in raw_keys if isinstance(raw_keys, list) else []:
            usable = self._usable(raw, previous)
            if usable is None:
                continue
            canonical, key = usable
            every.append(key)
            by_jwk[canonical] = key
            if isinstance(raw.get("kid"), str):
                by_kid[raw["kid"]] = key
            else:
                anonymous.append(key)
        if self._require_keys and not every:
            raise NoUsableKey("the key set holds no usable key")
        held = _Held(
            by_kid=by_kid,
            anonymous=tuple(anonymous),
            every=tuple(every),
            ids=frozenset(id(k) for k in every),
            by_jwk=by_jwk,
            fetched_at=time.monotonic(),
        )
        self._held = held
        return held

    def _usable(self, raw: Any, previous: dict[str, jwt.PyJWK]) -> tuple[str, jwt.PyJWK] | None:
        """One JWK's canonical text and key object (the previous object when the JWK is
        unchanged); None when this verifier cannot use it (the others still verify)."""
        if not isinstance(raw, dict):
            return None
        if self._signing_only and raw.get("use", "sig") != "sig":
            return None
        if self._require_kid and not isinstance(raw.get("kid"), str):
            return None
        try:
            canonical = json.dumps(raw, sort_keys=True)
        except (TypeError, ValueError):
            return None
        if canonical in previous:
            return canonical, previous[canonical]
        try:
            key = jwt.PyJWK.from_dict(raw, algorithm=raw.get("alg") or self._default_algorithm)
        except (jwt.PyJWTError, ValueError, TypeError, AttributeError, KeyError):
            return None
        return canonical, key
