"""QE-06: PostgreSQL's estimate of a narrowed statement, kept a short while per statement and
bound values, so a consumer repeating one statement pays one EXPLAIN round trip per
ESTIMATE_TTL_S instead of one per request (docs/gateway.md QE-06).

Why it may be kept: the estimate is a function of the statement, its bound values and the table
statistics. The first two are the key; the statistics change only with ANALYZE (by hand or by
autovacuum), which a short life follows soon enough — a table that grows fast is analysed by
autovacuum at the same pace, and an estimate some seconds old is as good a guess as a new one.
What is kept is the cost, not the verdict: a lower limit (a calibration, a reload) applies at once
to every kept estimate.

The key is a digest of the statement and its values: the values hold the row filter's keys, and
nothing personal is kept as it is, even in memory (the values are not needed again)."""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Sequence

# long enough that a steady consumer pays the round trip rarely, short enough that a table
# analysed after a bulk load is judged by its new statistics within the same minute
ESTIMATE_TTL_S = 30.0
# one entry is ~100 bytes: the whole cache stays under a megabyte
MAX_ESTIMATES = 8192


def estimate_key(sql: str, params: Sequence[object]) -> bytes:
    """A digest naming the statement with its bound values; `repr` tells a text '1' from an
    integer 1 and a list from a tuple, so two bindings with one key plan alike."""
    digest = hashlib.blake2b(sql.encode(), digest_size=20)
    digest.update(b"\x00")
    digest.update(repr(tuple(params)).encode())
    return digest.digest()


class EstimateCache:
    """The most recent estimates, each for ESTIMATE_TTL_S; the oldest make room past the bound."""

    def __init__(self, ttl_s: float = ESTIMATE_TTL_S, max_entries: int = MAX_ESTIMATES) -> None:
        self._ttl_s = ttl_s
        self._max = max_entries
        self._kept: OrderedDict[bytes, tuple[float, float]] = OrderedDict()

    def get(self, key: bytes) -> float | None:
        """The kept estimate, or None when there is none or it has expired."""
        kept = self._kept.get(key)
        if kept is None:
            return None
        cost, expires = kept
        if time.monotonic() >= expires:
            del self._kept[key]
            return None
        return cost

    def put(self, key: bytes, cost: float) -> None:
        self._kept[key] = (cost, time.monotonic() + self._ttl_s)
        self._kept.move_to_end(key)
        while len(self._kept) > self._max:
            self._kept.popitem(last=False)

    def clear(self) -> None:
        """Forget every estimate (the catalogue was reloaded: the tables may be others)."""
        self._kept.clear()

    def __len__(self) -> int:
        return len(self._kept)
