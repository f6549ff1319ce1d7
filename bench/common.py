"""Load generation and statistics shared by the benchmark sections (not tests)."""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field


@dataclass
class Stats:
    """Per-call latencies (seconds) and the wall time of the whole run."""

    latencies: list[float] = field(default_factory=list)
    wall: float = 0.0
    errors: int = 0

    @property
    def n(self) -> int:
        return len(self.latencies)

    def pct(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        ordered = sorted(self.latencies)
        # nearest rank: p99 of 100 samples is the 99th, never an interpolation past the data
        rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
        return ordered[rank - 1]

    @property
    def p50(self) -> float:
        return self.pct(50)

    @property
    def p99(self) -> float:
        return self.pct(99)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.latencies) if self.latencies else float("nan")

    @property
    def rps(self) -> float:
        return self.n / self.wall if self.wall > 0 else float("nan")


class UnexpectedAnswer(RuntimeError):
    pass


async def load(call: Callable[[], Awaitable[None]], total: int, concurrency: int, warmup: int = 0) -> Stats:
    """`total` calls by `concurrency` workers sharing one queue; `warmup` calls first, unmeasured.
    A call raises on an unexpected answer: the run stops there (a fast error is no result)."""
    for _ in range(warmup):
        await call()
    stats = Stats()
    remaining = total

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            t0 = time.perf_counter()
            await call()
            stats.latencies.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    stats.wall = time.perf_counter() - t0
    return stats


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f}"


@dataclass
class Row:
    section: str
    measure: str
    value: str
    note: str = ""


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    checks: list[tuple[str, bool, str]] = field(default_factory=list)

    def add(self, section: str, measure: str, value: str, note: str = "") -> None:
        self.rows.append(Row(section, measure, value, note))
        print(f"  {section:<34} {measure:<44} {value:>14}  {note}", flush=True)

    def check(self, name: str, ok: bool, detail: str) -> None:
        self.checks.append((name, ok, detail))
        print(f"  [{'ok' if ok else 'FAILED'}] {name}: {detail}", flush=True)

    def markdown(self) -> str:
        out = ["| section | measure | value | note |", "|---|---|---:|---|"]
        out += [f"| {r.section} | {r.measure} | {r.value} | {r.note} |" for r in self.rows]
        if self.checks:
            out += ["", "Checks:", ""]
            out += [f"- [{'x' if ok else ' '}] {name}: {detail}" for name, ok, detail in self.checks]
        return "\n".join(out)
