"""QE-06's calibration: what one unit of PostgreSQL's cost estimate takes on this database, so
the cost guard can refuse an estimate that cannot finish inside the statement timeout instead
of a fixed number an operator guessed.

Cost units are the planner's own: a sequential page read is 1, a tuple's CPU 0.01. How many
milliseconds a unit takes depends on the host, its load and the plan's kind. The probe is the
class the guard exists for — a window sorted over a cross join, nothing read from disk — run on a
datasets connection (the reader role, its session bounds); its largest node's estimate divided
by its fastest of a few runs' wall time is the figure. The fastest run, not the mean: a busy
host at start-up would otherwise make the gateway refuse what a quiet one serves. A statement
whose estimate is above `per_ms x statement timeout` would need the whole timeout at the probe's
pace, so it is refused before it runs (docs/gateway.md QE-06)."""

from __future__ import annotations

import time
from typing import Any

import asyncpg
import orjson

# 150 000 rows of a cross join sorted by a text key and ranked: ~100-250 ms on a 2-core
# development host. Measured there beside cross-join windows over a table's text column (1 000
# and 2 000 rows a side, 1.5 and 7 s): within 15 % of their pace, where an integer-keyed
# in-memory sort ran twice as fast per unit and would have let them through
PROBE = (
    "SELECT count(r) FROM (SELECT rank() OVER (ORDER BY md5(a.x::text), b.y) AS r"
    " FROM generate_series(1, 600) AS a(x), generate_series(1, 250) AS b(y)) AS w"
)
RUNS = 2
# the probe's own bound, whatever the deployment's statement timeout (a 50 ms one would cancel it)
PROBE_TIMEOUT_MS = 10_000


def largest_cost(node: dict[str, Any]) -> float:
    """The largest total cost of any node of an EXPLAIN (FORMAT JSON) plan. The root's is not
    enough: a LIMIT (or a page's OFFSET/LIMIT over a window) discounts its input's cost by the
    fraction it expects to read, while a sort or a window below it must read everything first."""
    cost = float(node.get("Total Cost", 0.0))
    for child in node.get("Plans", ()):
        cost = max(cost, largest_cost(child))
    return cost


def plan_cost(plan: Any) -> float:
    """The largest node's cost of EXPLAIN (FORMAT JSON)'s answer, text or decoded."""
    return largest_cost((orjson.loads(plan) if isinstance(plan, str | bytes) else plan)[0]["Plan"])


async def cost_per_ms(pool: asyncpg.Pool) -> float:
    """Cost units per millisecond of the probe on one of `pool`'s connections."""
    async with pool.acquire() as conn, conn.transaction(readonly=True):
        await conn.execute(f"SET LOCAL statement_timeout = {PROBE_TIMEOUT_MS}")
        cost = plan_cost(await conn.fetchval(f"EXPLAIN (FORMAT JSON) {PROBE}"))
        fastest = float("inf")
        for _ in range(RUNS):
            started = time.perf_counter()
            await conn.fetchval(PROBE)
            fastest = min(fastest, time.perf_counter() - started)
    return cost / max(fastest * 1000, 0.001)
