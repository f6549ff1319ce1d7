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


async def load_for(
    call: Callable[[], Awaitable[None]], seconds: float, concurrency: int, stats: Stats | None = None
) -> Stats:
    """`concurrency` workers calling `call` back to back until `seconds` have passed (into
    `stats`, which others may read as it fills)."""
    stats = stats if stats is not None else Stats()
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        while time.perf_counter() < deadline:
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
class Table:
    title: str
    header: list[str]
    rows: list[list[str]]
    note: str = ""

    def text(self) -> str:
        widths = [max(len(h), *(len(r[i]) for r in self.rows)) for i, h in enumerate(self.header)]
        lines = [f"  {self.title}" + (f" ({self.note})" if self.note else "")]
        for cells in [self.header, *self.rows]:
            lines.append(
                "    "
                + "  ".join(
                    c.rjust(w) if i else c.ljust(w)
                    for i, (c, w) in enumerate(zip(cells, widths, strict=True))
                )
            )
        return "\n".join(lines)

    def markdown(self) -> str:
        out = [f"**{self.title}**" + (f" — {self.note}" if self.note else ""), ""]
        out.append("| " + " | ".join(self.header) + " |")
        out.append("|" + "|".join(["---", *("---:" for _ in self.header[1:])]) + "|")
        out += ["| " + " | ".join(r) + " |" for r in self.rows]
        return "\n".join(out)


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    checks: list[tuple[str, bool, str]] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)

    def add(self, section: str, measure: str, value: str, note: str = "") -> None:
        self.rows.append(Row(section, measure, value, note))
        print(f"  {section:<34} {measure:<44} {value:>14}  {note}", flush=True)

    def table(self, table: Table) -> None:
        self.tables.append(table)
        print(table.text(), flush=True)

    def check(self, name: str, ok: bool, detail: str) -> None:
        self.checks.append((name, ok, detail))
        print(f"  [{'ok' if ok else 'FAILED'}] {name}: {detail}", flush=True)

    def markdown(self) -> str:
        out = ["| section | measure | value | note |", "|---|---|---:|---|"]
        out += [f"| {r.section} | {r.measure} | {r.value} | {r.note} |" for r in self.rows]
        for t in self.tables:
            out += ["", t.markdown()]
        if self.checks:
            out += ["", "Checks:", ""]
            out += [f"- [{'x' if ok else ' '}] {name}: {detail}" for name, ok, detail in self.checks]
        return "\n".join(out)
