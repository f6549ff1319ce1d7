"""What the admission checks of issues 15 and 34 cost a request (docs/gateway.md, QE-06, QE-10,
GS-14): the bench system with more gateway replicas beside replica 1 (every check as the bench
runs it: the calibrated cost guard, the consumer share and its total in Redis) — one with none of
them, and one with each alone: the calibrated cost guard (`QUERY_PLAN_COST_CALIBRATE`, one
`EXPLAIN` round trip more), the consumer share (QE-10, at a size no run reaches: the count in
the replica and a lease taken and given back in Redis, two round trips) and a rate limit no
request reaches (`RATE_LIMIT_PER_SECOND`, one Redis script call more) — measured in interleaved
rounds on the same warm path, side by side, with each one's ratio to the replica with none (not
a test, not part of run.py). QE-11's growth bound and QE-12's second parse cost no round trip:
bench/pg_parse.py measures them in-process.

    uv run python bench/limits.py --path edr --path normal --rounds 3 --requests 1000 --concurrency 1

Prints, per path and variant: gateway CPU ms per request (/proc, the figure other load on the
machine moves least), PostgreSQL CPU ms per request (the postmaster and its backends: the cost
guard plans the statement twice), p50 and p99 latency, req/s; then the medians over the rounds
and their ratios to the replica without any check."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import statistics
import sys
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from common import load
from cpu import tree_seconds
from system import Bench, Environment

# bench/profile.py by its path: `import profile` may name the standard library's module
_spec = importlib.util.spec_from_file_location("gateway_profile", Path(__file__).with_name("profile.py"))
assert _spec is not None and _spec.loader is not None
gateway_profile = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gateway_profile)

# a rate no run reaches: every request pays the script call and is admitted
UNREACHED_RATE = "1000000"
NONE = {
    "QUERY_PLAN_COST_CALIBRATE": "false",
    "QUERY_MAX_PLAN_COST": "0",
    "QUERY_MAX_CONCURRENT_PER_CONSUMER": "0",
    "QUERY_MAX_CONCURRENT_PER_CONSUMER_TOTAL": "0",
}
# replica 1 runs every check but the rate limit (bench/system.py: the share never reached)
VARIANTS: dict[str, dict[str, str]] = {
    "none": NONE,
    "guard": {**NONE, "QUERY_PLAN_COST_CALIBRATE": "true"},
    "share": {
        **NONE,
        "QUERY_MAX_CONCURRENT_PER_CONSUMER": "1000",
        "QUERY_MAX_CONCURRENT_PER_CONSUMER_TOTAL": "100000",
    },
    "limiter": {**NONE, "RATE_LIMIT_PER_SECOND": UNREACHED_RATE, "RATE_LIMIT_BURST": UNREACHED_RATE},
}


@dataclass
class Figures:
    gateway_ms: list[float] = field(default_factory=list)
    postgres_ms: list[float] = field(default_factory=list)
    p50_ms: list[float] = field(default_factory=list)
    p99_ms: list[float] = field(default_factory=list)
    rps: list[float] = field(default_factory=list)

    def median(self, name: str) -> float:
        return statistics.median(getattr(self, name))


@dataclass(frozen=True)
class Replica:
    name: str
    url: str
    pid: int


def _replica(bench: Bench, instance: str) -> Replica:
    record = next(r for r in reversed(bench.stack.records) if r.name == instance)
    return Replica(instance, f"http://127.0.0.1:{bench.stack.service_ports[instance]}", record.pid)


async def _round(
    call: Callable[[], Awaitable[None]], replica: Replica, pg: int, n: int, conc: int
) -> Figures:
    g0, p0 = gateway_profile.cpu_seconds(replica.pid), tree_seconds([pg])[pg]
    s = await load(call, n, conc)
    g1, p1 = gateway_profile.cpu_seconds(replica.pid), tree_seconds([pg])[pg]
    out = Figures()
    out.gateway_ms.append(1000 * (g1 - g0) / s.n)
    out.postgres_ms.append(1000 * (p1 - p0) / s.n)
    out.p50_ms.append(1000 * s.p50)
    out.p99_ms.append(1000 * s.p99)
    out.rps.append(s.rps)
    return out


def _merge(into: Figures, more: Figures) -> None:
    for name in ("gateway_ms", "postgres_ms", "p50_ms", "p99_ms", "rps"):
        getattr(into, name).extend(getattr(more, name))


def _line(path: str, variant: str, f: Figures, base: Figures | None) -> str:
    cells = []
    for name, label in (
        ("gateway_ms", "gw CPU ms/req"),
        ("postgres_ms", "pg CPU ms/req"),
        ("p50_ms", "p50 ms"),
    ):
        value = f.median(name)
        ratio = f" (x{value / base.median(name):.2f})" if base is not None and base.median(name) else ""
        cells.append(f"{label} {value:.3f}{ratio}")
    cells.append(f"p99 ms {f.median('p99_ms'):.2f}")
    cells.append(f"req/s {f.median('rps'):.0f}")
    return f"{path:<7} {variant:<8} " + ", ".join(cells)


async def _measure(bench: Bench, args: argparse.Namespace) -> None:
    replicas = {"all": _replica(bench, "query-gateway")}
    for variant, env in VARIANTS.items():
        instance = await asyncio.to_thread(bench.stack.add_instance, "query-gateway", env)
        replicas[variant] = _replica(bench, instance)
        print(f"== {variant}: {instance} at {replicas[variant].url} with {env}", flush=True)
    for path in args.path:
        calls = {v: await gateway_profile._call(bench, path, r.url) for v, r in replicas.items()}
        for call in calls.values():
            await load(call, 100, args.concurrency)  # warm: plans, ds decisions, prepared statements
        figures = {v: Figures() for v in replicas}
        for i in range(args.rounds):
            # interleaved, so the machine's other load weighs on every variant alike
            for variant, replica in replicas.items():
                one = await _round(calls[variant], replica, bench.pg_pid, args.requests, args.concurrency)
                _merge(figures[variant], one)
                print(f"   round {i + 1} " + _line(path, variant, one, None), flush=True)
        print(
            f"\n== {path} c={args.concurrency}: medians of {args.rounds} rounds of {args.requests} requests"
        )
        for variant in replicas:
            base = None if variant == "none" else figures["none"]
            print("== " + _line(path, variant, figures[variant], base), flush=True)
        print()


async def main_async(args: argparse.Namespace, root: Path) -> None:
    async with Environment(root, log=lambda s: print(f"[stack] {s}", flush=True)) as bench:
        await _measure(bench, args)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--path", choices=gateway_profile.PATHS, action="append", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dataplane-limits-") as tmp:
        asyncio.run(main_async(args, Path(tmp)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
