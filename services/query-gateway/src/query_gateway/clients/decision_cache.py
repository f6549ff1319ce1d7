"""The ds decision cache: one replica's memory of ds's answers, reused for at most the
`cache.ttl_seconds` ds put on each answer (docs/wire-contracts.md).

The key is the whole question — connector, consumer, agreement, transfer, purpose as sent, and the
set of datasets — so an answer is only ever reused for the question it answered. An answer that
carries no positive ttl is not kept; neither is anything that was not an answer (a transport
error, an error status, an unreadable body never reach `put`). A deny is kept like an allow: it
is ds's decision all the same, for as long as ds said.

Counting (`query_gateway_ds_decision_cache_{hits,misses}_total`): every `get` of an enabled cache
counts a hit or a miss — an entry found expired is a miss. A disabled cache counts nothing, so the
two counters only ever describe a cache that was consulted."""

from __future__ import annotations

import time
from collections.abc import Callable

from dataplane_contracts.ds import AuthorizeRequest, DecisionEnvelope
from dataplane_service_kit.bounded_cache import BoundedCache
from query_gateway.metrics import Metrics

# (connector base, consumer DID, agreement, transfer, purpose as sent, sorted distinct datasets)
DecisionKey = tuple[str, str, str, str | None, tuple[str, ...], tuple[str, ...]]


def decision_key(base: str, request: AuthorizeRequest) -> DecisionKey:
    # purpose keeps its order: it is passed to ds as a list, and ds may read it as one. The
    # datasets are judged as a set (one decision for every touched dataset), so their order in
    # the statement does not make another question.
    return (
        base,
        request.consumer_did,
        request.agreement_id,
        request.transfer_id,
        tuple(request.purpose),
        tuple(sorted(set(request.dataset_ids))),
    )


def ttl_of(envelope: DecisionEnvelope) -> int | None:
    """The positive lifetime ds promised for this answer, else None (not to be kept)."""
    cache = envelope.cache
    if cache is None or cache.ttl_seconds is None or cache.ttl_seconds <= 0:
        return None
    return cache.ttl_seconds


class DsDecisionCache:
    """A bounded LRU of ds answers with a per-entry deadline on a monotonic clock.

    Entries are the parsed envelopes themselves, shared by every request they answer: the model
    is frozen, and the gateway only reads it (a verdict's row filter is parsed into a new model
    each time), so a hit costs one tuple, one dict lookup and one clock read — no pydantic work.
    Single-threaded by design (the gateway's event loop): no method awaits, so no lock."""

    def __init__(
        self,
        maxsize: int,
        *,
        enabled: bool = True,
        clock: Callable[[], float] = time.monotonic,
        metrics: Metrics | None = None,
    ) -> None:
        self.enabled = enabled
        metrics = metrics if metrics is not None else Metrics()
        self._hits, self._misses = metrics.ds_decision_cache_hits, metrics.ds_decision_cache_misses
        self._clock = clock
        self._entries: BoundedCache[DecisionKey, tuple[float, DecisionEnvelope]] = BoundedCache(maxsize)

    def __len__(self) -> int:
        return len(self._entries)

    def now(self) -> float:
        return self._clock()

    def get(self, key: DecisionKey) -> DecisionEnvelope | None:
        if not self.enabled:
            return None
        entry = self._entries.get(key)
        if entry is not None:
            if self._clock() < entry[0]:
                self._hits.inc()
                return entry[1]
            self._entries.pop(key)  # expired: never served again, and no longer takes room
        self._misses.inc()
        return None

    def put(self, key: DecisionKey, envelope: DecisionEnvelope, asked_at: float | None = None) -> None:
        """Keep `envelope` until `asked_at` + its ttl. `asked_at` is when the question was sent:
        ds decided after that, so counting from it never stretches the lifetime ds promised."""
        if not self.enabled:
            return
        ttl = ttl_of(envelope)
        if ttl is None:
            # a newer answer without a lifetime also retires an older one kept for this question
            self._entries.pop(key)
            return
        start = self._clock() if asked_at is None else asked_at
        self._entries.put(key, (start + ttl, envelope))
