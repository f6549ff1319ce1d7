"""Exponential backoff, one schedule for every retry loop of the services: the resolver's
upstream retries and consumer restarts, the relay's delivery retries and broker connects.

Its own small module rather than a retry library (tenacity, stamina): the callers need the delay
itself, not a decorated call — the relay blocks one partition's window for it, the resolver's
retries take an injected sleep so a test reads the exact schedule — and the schedule is a line of
arithmetic. Delays are in seconds."""

from __future__ import annotations

import math
import random


def exponential_delay(
    attempt: int,
    *,
    initial_s: float,
    max_s: float = math.inf,
    jitter: bool = False,
    rng: random.Random | None = None,
) -> float:
    """The wait after failure number `attempt` (0 for the first): `initial_s`, doubling, at most
    `max_s`. With `jitter`, equal jitter — half of it fixed, half uniformly random — so clients
    that failed together do not retry together."""
    capped = min(max_s, initial_s * 2.0 ** min(attempt, 30))
    if not jitter:
        return capped
    uniform = rng.uniform if rng is not None else random.uniform
    return capped / 2 + uniform(0, capped / 2)


class Backoff:
    """A loop's running schedule: `next()` is the wait after one more failure, `reset()` after a
    success."""

    def __init__(self, initial_s: float, max_s: float, *, jitter: bool = False) -> None:
        self._initial_s = initial_s
        self._max_s = max_s
        self._jitter = jitter
        self.failures = 0

    def next(self) -> float:
        delay = exponential_delay(
            self.failures, initial_s=self._initial_s, max_s=self._max_s, jitter=self._jitter
        )
        self.failures += 1
        return delay

    def reset(self) -> None:
        self.failures = 0
