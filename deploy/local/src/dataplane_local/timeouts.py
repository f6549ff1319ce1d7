"""One factor for every wall-clock limit of the test helpers and the local servers' start-up.

`DATAPLANE_TEST_TIMEOUT_FACTOR` (default 1): on a slow or loaded machine set it to 3, say, and
every such limit waits three times as long instead of failing. It scales limits only — waiting
for something to happen — never a delay that a test needs to be short."""

from __future__ import annotations

import os

ENV_VAR = "DATAPLANE_TEST_TIMEOUT_FACTOR"


def timeout_factor() -> float:
    raw = os.environ.get(ENV_VAR, "").strip()
    if not raw:
        return 1.0
    try:
        factor = float(raw)
    except ValueError:
        raise ValueError(f"{ENV_VAR} must be a number, not {raw!r}") from None
    if factor <= 0:
        raise ValueError(f"{ENV_VAR} must be above 0")
    return factor


def scaled(seconds: float) -> float:
    """`seconds` times the factor: a limit on waiting, scaled for this machine."""
    return seconds * timeout_factor()
