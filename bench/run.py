"""Benchmarks of the whole data plane, every figure measured side by side in one run.

    uv run python bench/run.py [--quick] [--dir D] [--out bench/RESULTS.md] [--only SECTION ...]

Starts its own system (an embedded PostgreSQL with a 1 000 000-row table, then the local stack
with two gateway replicas and one resolver), measures, prints a table, writes RESULTS.md with the
machine's cores and the date, and stops everything. Not a test: no figure here is asserted, but
the sanity checks (EXPLAIN uses the index, same rows as the floor, ...) are reported, and the exit
status is 1 when one fails. `--quick` runs the same sections with small sample sizes."""

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
from system import KEYS, ROWS, Environment

HERE = Path(__file__).resolve().parent


def _header(quick: bool, took: float, load: str) -> str:
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
            "the load generator (httpx, one shared client) runs on the same cores",
            f"- data: `bench_readings`, {ROWS:,} rows, 10 000 pods × 100 readings, "
            "index on `pod` and `owner`; "
            f"the ds verdict carries a `subject_key_match` filter of {KEYS} keys (10 000 matching rows)",
            "- floor: the statement the gateway runs (its own narrowing and page query), through asyncpg "
            "with a pool of 10 like the gateway's; added latency = gateway percentile − floor percentile",
            "- a dataspace request (EDR or DPS pull) includes ds's `POST /internal/dataplane/authorize` "
            "(the ds double, a Python process here) and the disclosure publish awaited with acks=all; "
            "the relay delivers those disclosures to the ds double during the same runs",
            f"- load average when the run started: {load}",
            "",
            "",
        ]
    )


SECTIONS = ("edr", "normal", "lookup", "revocation", "audit")


async def main_async(quick: bool, root: Path, out: Path, only: tuple[str, ...] = SECTIONS) -> int:
    sizes = sections.Sizes.of(quick)
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())  # other work on the machine skews figures
    report = Report()
    t0 = time.perf_counter()
    async with Environment(root, log=lambda s: print(f"[stack] {s}", flush=True)) as bench:
        await asyncio.sleep(3)  # let start-up work (group joins, first deliveries) settle
        print(f"\n{'section':<36} {'measure':<44} {'value':>14}  note")
        if "edr" in only:
            await sections.edr_and_pull(bench, report, sizes)
        if "normal" in only:
            await sections.normal_path(bench, report, sizes)
        if "lookup" in only:
            await sections.lookup_miss(bench, report, sizes)
        if "revocation" in only:
            await sections.revocation(bench, report, sizes)
        if "audit" in only:
            await sections.audit_burst(bench, report, sizes)
    took = time.perf_counter() - t0
    text = _header(quick, took, load) + report.markdown() + "\n"
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
    args = parser.parse_args()
    only = tuple(args.only or SECTIONS)
    if args.dir is not None:
        return asyncio.run(main_async(args.quick, args.dir.resolve(), args.out, only))
    with tempfile.TemporaryDirectory(prefix="dataplane-bench-") as tmp:
        return asyncio.run(main_async(args.quick, Path(tmp), args.out, only))


if __name__ == "__main__":
    sys.exit(main())
