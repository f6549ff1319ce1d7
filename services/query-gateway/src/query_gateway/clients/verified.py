"""A bounded memo of tokens whose signature already verified, so a client repeating its bearer does
not pay the signature check and claim parsing on every request.

The memo changes no outcome: an entry is only a shortcut to the answer the full check would give
now. Each entry names the key object that verified it, and the caller serves it only while that
very object is still in its current key set (a refetched set holds new objects, so every entry of
the old set is dropped); an entry with an `exp` is never served at or after it (PyJWT's own test,
`exp <= now` expired, no leeway). Everything the full check reads besides the signature, the key
set and the time — issuer, audience, algorithms — is fixed for the process. What a token only
*names* (a DPS pull grant, ds's decision) is still looked up on every request by the callers."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from dataplane_service_kit.bounded_cache import BoundedCache

V = TypeVar("V")

DEFAULT_SIZE = 4096


@dataclass(frozen=True)
class Verified(Generic[V]):
    value: V
    key: object  # the key object that verified the signature
    exp: int | None  # the token's `exp` as PyJWT reads it (int(...)); None: the check ignores exp


def exp_of(claims: dict[str, Any]) -> int | None:
    """`exp` exactly as PyJWT compares it: `int(payload["exp"])` (a float, a numeric string and a
    bool included); None when absent or when `int` refuses it. A token whose `exp` is present but
    unreadable is not memoised (`memoisable`): the full check decides it every time."""
    if "exp" not in claims:
        return None
    try:
        return int(claims["exp"])
    except (ValueError, TypeError, OverflowError):
        return None


def memoisable(claims: dict[str, Any]) -> bool:
    return "exp" not in claims or exp_of(claims) is not None


class VerifiedTokens(Generic[V]):
    """Least recently used, at most `size` tokens."""

    def __init__(self, size: int = DEFAULT_SIZE) -> None:
        self._entries: BoundedCache[str, Verified[V]] = BoundedCache(size)

    def get(self, token: str) -> Verified[V] | None:
        """The entry, if it has not expired; an expired entry is dropped. The caller still checks
        that `entry.key` is in its current key set."""
        entry = self._entries.get(token)
        if entry is None:
            return None
        if entry.exp is not None and entry.exp <= time.time():
            self._entries.pop(token)
            return None
        return entry

    def put(self, token: str, value: V, key: object, exp: int | None) -> None:
        self._entries.put(token, Verified(value, key, exp))

    def drop(self, token: str) -> None:
        self._entries.pop(token)

    def __len__(self) -> int:
        return len(self._entries)
