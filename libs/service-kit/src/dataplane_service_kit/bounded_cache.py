"""A small bounded map, least recently used evicted first: the one eviction rule of the services'
in-process memos (the gateway's plans, ds decisions, verified tokens, narrowed statements, used
pull tokens).

Every operation is O(1) (an OrderedDict underneath). What an entry is worth — an expiry, the key
set or catalogue it belongs to — stays with the caller, which stores it in the value and `pop`s an
entry it will not serve. Not thread-safe: a caller that shares one across threads holds its own
lock. Values are never None (`get` answers None for a miss)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class BoundedCache(Generic[K, V]):
    __slots__ = ("_entries", "_maxsize")

    def __init__(self, maxsize: int) -> None:
        if maxsize < 1:
            raise ValueError("maxsize must be at least 1")
        self._maxsize = maxsize
        self._entries: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        """The value, now the most recently used; None when absent."""
        value = self._entries.get(key)
        if value is not None:
            self._entries.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        """Keep `value` as the most recently used; the least recently used goes when full."""
        entries = self._entries
        entries[key] = value
        entries.move_to_end(key)
        if len(entries) > self._maxsize:
            entries.popitem(last=False)

    def pop(self, key: K) -> None:
        """Forget `key`, if it is kept."""
        self._entries.pop(key, None)

    def __contains__(self, key: object) -> bool:
        """Whether `key` is kept; does not count as a use."""
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)
