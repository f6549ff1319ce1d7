"""What QE-12's second parse and QE-11's growth bound cost the gateway (docs/gateway.md): CPU ms
per request of the pure SQL steps — validation, the rewrite and its sqlglot verification, then
PostgreSQL's reading of the caller's statement, of the narrowed one and of the page statements
around it (sql/pg_verify.py), then the growth bound of the validated statement (sql/growth.py,
as the gateway calls it: a verdict kept per text) — on the bench's EDR and normal statements,
without either, with the second parse, and with both, interleaved in one run.

Two regimes: `cold`, each request a text never seen (a fresh literal in it), so no cache helps
any step; `warm`, the same text each time, as a bench's load repeats it (every step cached).
Process CPU time (time.process_time), one thread, no I/O. Not part of run.py.

    uv run python bench/pg_parse.py [--rounds 7] [--requests 300]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from collections.abc import Callable

from dataplane_contracts.catalogue import Catalogue
from dataplane_contracts.plans import Plan
from dataplane_service_kit.bounded_cache import BoundedCache
from query_gateway.sql import narrow_query, validate_query
from query_gateway.sql.growth import check_growth
from query_gateway.sql.pg_verify import check_narrowed, check_original
from query_gateway.state import GROWTH_VERDICTS_KEPT

TABLE = "bench_readings"  # bench/system.py's table, here without a database
EDR_SQL = f"SELECT pod, count(*) AS readings, avg(value) AS mean FROM {TABLE} GROUP BY pod ORDER BY pod"
USER_SQL = f"SELECT ts, value FROM {TABLE} ORDER BY ts"
COLUMNS = {f"public.{TABLE}": {"pod": "text", "ts": "timestamptz", "value": "double precision"}}
CATALOGUE = Catalogue.model_validate(
    {
        "datasets": [
            {
                "id": TABLE,
                "table": f"public.{TABLE}",
                "row_filters": {
                    "person": {"handler": "subject_key_match", "args": {"column": "pod", "key_type": "pod"}},
                    "organization": {"handler": "allow_all", "binds": "organization"},
                },
            }
        ]
    }
)
PLANS = {TABLE: [Plan.among("pod", [f"P{i:07d}" for i in range(20)], key_type="pod", label="pods")]}
_fresh = itertools.count()
MAX_VALUE_BYTES = 4 * 1024 * 1024  # QUERY_MAX_VALUE_BYTES's default
_verdicts: BoundedCache[str, bool] = BoundedCache(GROWTH_VERDICTS_KEPT)
STEPS = ("neither", "+QE-12", "+QE-12+QE-11")


def _text(sql: str, cold: bool) -> str:
    # a cold request's text differs by a literal, so no step's cache (all keyed by text) has it
    return sql.replace(" FROM ", f", {next(_fresh)} AS k FROM ", 1) if cold else sql


def _request(sql: str, step: str) -> None:
    q = validate_query(sql, CATALOGUE)
    if step != "neither":
        check_original(q)
    if step == "+QE-12+QE-11" and _verdicts.get(q.text) is None:
        check_growth(q, COLUMNS, MAX_VALUE_BYTES)  # the gateway keeps the verdict per text
        _verdicts.put(q.text, True)
    narrowed = narrow_query(q, CATALOGUE, PLANS, COLUMNS)
    if step != "neither":
        check_narrowed(narrowed)


def _ms_per_request(run: Callable[[], None], n: int) -> float:
    start = time.process_time()
    for _ in range(n):
        run()
    return (time.process_time() - start) * 1000 / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--requests", type=int, default=300)
    args = ap.parse_args()
    statements = (("EDR", EDR_SQL), ("normal", USER_SQL))
    cases = [(path, sql, cold) for path, sql in statements for cold in (True, False)]
    figures: dict[tuple[str, bool, str], list[float]] = {}
    for _path, sql in statements:  # the warm regime's caches filled before any is timed
        _request(sql, STEPS[-1])
    for _ in range(args.rounds):  # interleaved: each round measures every variant once
        for path, sql, cold in cases:
            for step in STEPS:
                ms = _ms_per_request(lambda s=sql, c=cold, p=step: _request(_text(s, c), p), args.requests)
                figures.setdefault((path, cold, step), []).append(ms)
    print("| statement | regime | neither (ms/request) | + second parse | + growth bound | added, both |")
    print("| --- | --- | --- | --- | --- | --- |")
    for path, _sql, cold in cases:
        neither, second, both = (statistics.median(figures[(path, cold, step)]) for step in STEPS)
        regime = "cold" if cold else "warm"
        print(f"| {path} | {regime} | {neither:.3f} | {second:.3f} | {both:.3f} | {both - neither:+.3f} |")
    print(f"\nmedian of {args.rounds} interleaved rounds of {args.requests} requests each")


if __name__ == "__main__":
    main()
