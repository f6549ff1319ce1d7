"""QE-10: a consumer's share of the datasets pool. Each consumer may have at most
QUERY_MAX_CONCURRENT_PER_CONSUMER statements running on one replica at once; one more is
answered `429 too_many_concurrent_queries` with `Retry-After` at once, instead of waiting for a
connection its own slow statements hold. So one consumer flooding slow statements leaves the rest
of the pool to everyone else (docs/gateway.md).

The share is counted in this process: it bounds what one consumer holds of this replica's pool,
which is what the pool's wait needs. Nothing leaks when it is exceeded, so there is no store to
lose and refuse on; the keys are the same kind-tagged identities the rate limiter uses, held
only in memory and never logged."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from dataplane_service_kit.errors import ServiceError

RETRY_AFTER_S = "1"


class ConsumerSlots:
    """Counts the statements each consumer has running; `limit` 0 turns the share off."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._running: dict[str, int] = {}

    def running(self, who: str) -> int:
        return self._running.get(who, 0)

    @contextlib.contextmanager
    def hold(self, who: str) -> Iterator[None]:
        """One slot of `who`'s share for the block, or the refusal before anything runs. No await
        between the check and the count: the event loop cannot let a second request in between."""
        if not self.limit:
            yield
            return
        held = self._running.get(who, 0)
        if held >= self.limit:
            raise ServiceError(
                "too_many_concurrent_queries",
                f"this consumer already has {self.limit} queries running; retry when one has finished",
                headers={"Retry-After": RETRY_AFTER_S},
            )
        self._running[who] = held + 1
        try:
            yield
        finally:
            left = self._running[who] - 1
            if left:
                self._running[who] = left
            else:
                del self._running[who]  # an idle consumer costs nothing
