"""The one backoff schedule (dataplane_service_kit.backoff): doubling from the first wait, capped,
with equal jitter where asked, restarted by a success."""

from __future__ import annotations

import random

from dataplane_service_kit.backoff import Backoff, exponential_delay


def test_the_schedule_doubles_from_the_first_wait_up_to_the_cap() -> None:
    schedule = [exponential_delay(n, initial_s=0.5, max_s=5.0) for n in range(6)]
    assert schedule == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    assert exponential_delay(10_000, initial_s=0.02) == 0.02 * 2.0**30  # no overflow on a long outage


def test_equal_jitter_keeps_half_of_the_wait_fixed() -> None:
    rng = random.Random(3)
    delays = [exponential_delay(6, initial_s=1.0, max_s=8.0, jitter=True, rng=rng) for _ in range(50)]
    assert all(4.0 <= d <= 8.0 for d in delays)
    assert len(set(delays)) > 1


def test_a_loop_schedule_restarts_after_a_success() -> None:
    backoff = Backoff(0.05, 2.0)
    assert [backoff.next() for _ in range(7)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0]
    backoff.reset()
    assert backoff.next() == 0.05
