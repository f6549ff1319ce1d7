"""Benchmarks of the whole data plane, every figure measured side by side in one run.

    uv run python bench/run.py [--quick] [--dir D] [--out bench/RESULTS.md] [--only SECTION ...]

Starts its own system (an embedded PostgreSQL with a 1 000 000-row table, then the local stack
with two gateway replicas and one resolver), measures, prints a table, writes RESULTS.md with the
machine's cores and the date, and stops everything. Not a test: no figure here is asserted, but
the sanity checks (EXPLAIN uses the index, same rows as the floor, every HTTP answer 2xx, ...) are
reported, and the exit status is 1 when one fails. `--quick` runs the same sections with short runs.
HTTP load is wrk's (`bench/wrk/post.lua`) when `wrk` is installed, else a Python fallback (said so)."""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import sections
from common import Report
from harness import Harness
from system import DS_DECISION_TTL, KEYS, ROWS, Environment

HERE = Path(__file__).resolve().parent


def _header(quick: bool, took: float, load: str, loadgen: str, seconds: float, margin: float) -> str:
    cpu = platform.processor() or platform.machine()
    try:
        model = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        model = cpu
    return "\n".join(
        [
            "# Benchmark results",
            "",
            f"- date: {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}",
            f"- machine: {os.cpu_count()} cores ({model}), "
            f"Python {platform.python_version()}, {platform.system()}",
            f"- mode: {'quick' if quick else 'full'}; run took {took:.0f}s; "
            f"produced by `uv run python bench/run.py{' --quick' if quick else ''}`",
            "- system: every service a separate process on this machine (2 gateway replicas, 1 resolver, "
            "audit relay, signaling), Tansu, embedded PostgreSQL and Valkey, the development doubles; "
            "the load generator runs on the same cores",
            f"- load generator: {loadgen}; closed loop at a fixed number of connections (concurrency 1 "
            f"and 32), each run measured over a steady window of {seconds:.0f}s between a warm-up margin "
            f"and a closing margin of {margin:.0f}s each (req/s and CPU: the window; latency percentiles: "
            "the whole run); sections 1, 2a and 2b load **gateway replica 1 only** (gw-1), so its CPU per "
            "request is the whole request's",
            f"- data: `bench_readings`, {ROWS:,} rows, 10 000 pods × 100 readings, "
            "index on `pod` and `owner`; "
            f"the ds verdict carries a `subject_key_match` filter of {KEYS} keys (10 000 matching rows)",
            "- floor: the statement the gateway runs (its own narrowing and page query), through asyncpg "
            "with a pool of 10 like the gateway's, in the bench process (no HTTP); added latency = gateway "
            "percentile − floor percentile",
            "- ceiling: `bench/ceiling.py`, a raw ASGI app under uvicorn as the gateway is served (uvloop, "
            "httptools) running only that statement (pool of 10) and answering the gateway's JSON, loaded "
            "by the same load generator; the full-work ceiling also publishes the request's "
            "`DisclosureRecorded` (acks=all, awaited), as a dataspace request must once ds's decision "
            "is cached",
            "- CPU ms per request: utime+stime of each process (with its children: PostgreSQL is the "
            "postmaster and every backend) from /proc over the window, ÷ requests the answering server "
            "completed in it (its own count); the load generator is wrk's process (the bench process for "
            "the fallback and for the floor)",
            "- a dataspace request (EDR or DPS pull) includes ds's `POST /internal/dataplane/authorize` "
            "(the ds double, a Python process here) unless the gateway holds ds's decision (its verdict "
            f"carries `cache.ttl_seconds` = {DS_DECISION_TTL}; the runs' notes give the authorize calls per "
            "request) and the disclosure publish awaited with acks=all; the relay delivers those "
            "disclosures to the ds double during the same runs",
            f"- load average when the run started: {load}",
            "",
            "",
        ]
    )


SECTIONS = ("idle", "edr", "fence", "normal", "servers", "lookup", "revocation", "audit")


async def main_async(
    quick: bool, root: Path, out: Path, only: tuple[str, ...] = SECTIONS, loadgen: str = "auto"
) -> int:
    sizes = sections.Sizes.of(quick)
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())  # other work on the machine skews figures
    report = Report()
    t0 = time.perf_counter()
    async with Environment(root, log=lambda s: print(f"[stack] {s}", flush=True)) as bench:
        await asyncio.sleep(3)  # let start-up work (group joins, first deliveries) settle
        h = Harness.of(bench, report, sizes.seconds, sizes.margin, python_only=loadgen == "python")
        if h.gen.wrk is None and loadgen == "auto":
            print("wrk is not installed (Debian package `wrk`): falling back to the Python load generator")
        print(f"load generator: {h.gen.name}")
        print(f"\n{'section':<36} {'measure':<44} {'value':>14}  note")
        if "idle" in only:  # first: nothing has run yet, no backlog of an earlier section
            await sections.idle_stack(bench, report, sizes)
        if "edr" in only:
            await sections.edr_and_pull(bench, report, sizes, h)
        if "fence" in only:
            await sections.fence_rule(bench, report, sizes, h)
        if "normal" in only:
            await sections.normal_path(bench, report, sizes, h)
        if "servers" in only:
            await sections.servers(bench, report, sizes, h)
        if "lookup" in only:
            await sections.lookup_miss(bench, report, sizes)
        if "revocation" in only:
            await sections.revocation(bench, report, sizes)
        if "audit" in only:
            await sections.audit_burst(bench, report, sizes)
        loadgen = h.gen.name
    took = time.perf_counter() - t0
    text = _header(quick, took, load, loadgen, sizes.seconds, sizes.margin) + report.markdown() + "\n"
    await asyncio.to_thread(out.write_text, text)
    print(f"\nwrote {out} ({took:.0f}s)")
    return 0 if all(ok for _, ok, _ in report.checks) else 1


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small sample sizes (a smoke run)")
    parser.add_argument("--dir", type=Path, default=None, help="state directory (default: a temporary one)")
    parser.add_argument("--out", type=Path, default=HERE / "RESULTS.md")
    parser.add_argument(
        "--only",
        choices=SECTIONS,
        action="append",
        help="run only this section (repeatable; 2a runs with edr); a partial run should not overwrite "
        "RESULTS.md: give --out",
    )
    parser.add_argument(
        "--loadgen",
        choices=("auto", "python"),
        default="auto",
        help="auto: wrk when installed, else the Python fallback; python: the fallback in any case",
    )
    args = parser.parse_args()
    only = tuple(args.only or SECTIONS)
    if args.dir is not None:
        return asyncio.run(main_async(args.quick, args.dir.resolve(), args.out, only, args.loadgen))
    with tempfile.TemporaryDirectory(prefix="dataplane-bench-") as tmp:
        return asyncio.run(main_async(args.quick, Path(tmp), args.out, only, args.loadgen))


if __name__ == "__main__":
    sys.exit(main())
