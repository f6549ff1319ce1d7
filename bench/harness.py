"""What the HTTP sections share: the benchmarked processes (found through the Stack object), the
load generator, the ceiling processes, measured runs with their CPU, and the CPU table."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from ceiling import CeilingProcess
from common import Report, Table, ms
from cpu import Processes, pid_listening_on
from loadgen import LOADGEN, Counter, LoadGenerator, Run, Target, measured_floor
from system import Bench

from dataplane_local import infra
from dataplane_local.procs import record_alive

# table column → (stack record name, or a special source); in the order printed
GW1, GW2, CEILING, DS, PG, KAFKA, RELAY, RESOLVER, VALKEY = (
    "gw-1",
    "gw-2",
    "ceiling",
    "ds double",
    "postgres",
    "kafka",
    "relay",
    "resolver",
    "valkey",
)
COLUMNS = (GW1, GW2, CEILING, DS, PG, KAFKA, RELAY, RESOLVER, VALKEY, LOADGEN)
_RECORDS = {
    GW1: "query-gateway",
    GW2: "query-gateway-2",
    DS: "ds-connector",
    KAFKA: "kafka",
    RELAY: "audit-relay",
    RESOLVER: "filter-resolver",
    VALKEY: "redis",
}


def _concurrency(run: Run) -> int:
    match = re.search(r"c=(\d+)", run.label)
    return int(match.group(1)) if match else 1


def _port(url: str) -> int | None:
    try:
        return urlsplit(url if "://" in url else f"tcp://{url}").port
    except ValueError:
        return None


def benchmarked_processes(bench: Bench) -> tuple[Processes, list[str]]:
    """Every process of the table by pid: the stack's records, replica 1 confirmed (or found) as
    the process listening on its port; PostgreSQL is the bench's own postmaster."""
    procs = Processes()
    notes: list[str] = []
    records = {r.name: r for r in bench.stack.records if record_alive(r)}
    for column, name in _RECORDS.items():
        rec = records.get(name)
        pid = rec.pid if rec is not None else None
        port = bench.stack.service_ports.get(name) or (_port(rec.url) if rec is not None else None)
        if column in (GW1, GW2) and port is not None:
            listener = pid_listening_on(port)
            if listener is not None and listener != pid:
                notes.append(f"{column}: record pid {pid}, port {port} served by pid {listener} (used)")
                pid = listener
        if pid is None:
            notes.append(f"{column}: no live process found, not measured")
        procs.add(column, pid)
    procs.add(PG, bench.pg_pid)
    return procs, notes


@dataclass
class Harness:
    bench: Bench
    report: Report
    gen: LoadGenerator
    procs: Processes
    seconds: float  # the measured window of each run
    margin: float  # load before and after the window (warm-up, and no edge effects)
    relay_url: str = ""
    runs: list[Run] = field(default_factory=list)
    ceiling_pids: dict[str, int] = field(default_factory=dict)  # URL → pid
    undelivered: list[str] = field(default_factory=list)  # runs whose disclosures the relay lost

    @classmethod
    def of(
        cls, bench: Bench, report: Report, seconds: float, margin: float, python_only: bool = False
    ) -> Harness:
        procs, notes = benchmarked_processes(bench)
        for n in notes:
            print(f"  [processes] {n}", flush=True)
        gen = LoadGenerator(bench.root / "loadgen", bench.http, procs, python_only)
        relay = bench.info.service_urls("audit-relay")[0]
        return cls(bench, report, gen, procs, seconds, margin, relay)

    # ------------------------------------------------------------------------------ ceilings
    @contextlib.asynccontextmanager
    async def ceiling(
        self,
        name: str,
        spec: dict[str, Any],
        full_work: bool = False,
        server: str = "uvicorn",
        workers: int = 1,
    ) -> AsyncIterator[str]:
        """A ceiling process (or group, `workers`) for the block; its URL. Stopped at the end,
        whatever happens."""
        proc = CeilingProcess(name, self.bench.root / "ceiling", spec, full_work, server, workers)
        url = ""
        try:
            url = await asyncio.to_thread(proc.start, infra.free_port())
            self.ceiling_pids[url] = proc.pid
            yield url
        finally:
            self.ceiling_pids.pop(url, None)
            await asyncio.to_thread(proc.stop)

    def _ceiling_of(self, target: Target) -> int | None:
        return next((pid for url, pid in self.ceiling_pids.items() if target.url.startswith(url + "/")), None)

    # ------------------------------------------------------------------------------ runs
    async def _delivered(self) -> float:
        return await self.bench.metric(self.relay_url, "audit_relay_delivered_total")

    async def _await_delivered(self, target: float, timeout: float, stall: float = 10.0) -> float:
        """Until the relay has delivered `target` disclosures in all; the seconds it took (nan:
        not within `timeout`, or no progress for `stall` seconds)."""
        t0 = last_move = time.perf_counter()
        last = -1.0
        while time.perf_counter() - t0 < timeout and time.perf_counter() - last_move < stall:
            delivered = await self._delivered()
            if delivered >= target:
                return time.perf_counter() - t0
            if delivered != last:
                last, last_move = delivered, time.perf_counter()
            await asyncio.sleep(0.2)
        return math.nan

    def counter(self, url: str, *more: str) -> Counter:
        """The answering server's own count of requests answered: the gateway's
        `query_gateway_requests_total`, a ceiling's `GET /_count`; with `more` servers (replicas
        sharing the load), the sum of their counts."""
        if more:
            counts = [self.counter(u) for u in (url, *more)]

            async def summed() -> float:
                return sum(await asyncio.gather(*(c() for c in counts)))

            return summed
        base = next((u for u in self.ceiling_pids if url.startswith(u + "/")), None)
        if base is not None:

            async def ceiling_count() -> float:
                return float((await self.bench.http.get(f"{base}/_count")).json()["answered"])

            return ceiling_count
        gw = next(g for g in self.bench.gateways if url.startswith(g + "/"))

        async def gateway_count() -> float:
            return await self.bench.metric(gw, "query_gateway_requests_total")

        return gateway_count

    async def http(self, target: Target, concurrency: int, *, disclosures: bool = False) -> Run:
        """One measured run (loadgen: a steady window in the middle). `disclosures`: each answer
        published one disclosure; the relay is awaited until it delivered them all, so the next
        run does not share the machine with this one's backlog."""
        pid = self._ceiling_of(target)
        count = target.count or self.counter(*target.urls)
        target = dataclasses.replace(target, count=count)
        if pid is not None:
            self.procs.add(CEILING, pid)
        try:
            gateway_ds = disclosures and pid is None
            if gateway_ds:
                await self.bench.ds_control({"action": "clear_calls"})
            delivered0 = await self._delivered() if disclosures else 0.0
            answered0 = await count()
            run = await self.gen.run(target, concurrency, self.seconds, self.margin)
            answered = await count() - answered0  # the whole run's, the in-flight ones finished
            notes = [run.note] if run.note else []
            if disclosures:
                d = await self._await_delivered(delivered0 + answered, 120)
                if math.isnan(d):
                    self.undelivered.append(run.label)
                    notes.append("relay did NOT deliver every disclosure (stalled or > 120 s)")
                else:
                    notes.append(f"relay caught up {d:.1f}s after the run")
            if gateway_ds:
                calls = (
                    await self.bench.http.get(
                        f"{self.bench.info.ds_url}/_calls", params={"endpoint": "authorize"}
                    )
                ).json()
                notes.append(f"ds authorize calls per request {len(calls) / max(1.0, answered):.2f}")
            run.note = "; ".join(notes)
            if pid is not None:
                run.server, run.server_idle = CEILING, f"{CEILING}@{pid}"
            elif target.url.startswith(self.bench.gateways[0] + "/"):
                run.server, run.server_idle = GW1, GW1
        finally:
            self.procs.remove(CEILING)
        self.runs.append(run)
        return run

    async def idle(self, seconds: float) -> dict[str, float]:
        """CPU ms per second of every process (each ceiling as `ceiling@PID`) while nothing is
        asked of the system: the consumers' polling, timers, ..."""
        for pid in self.ceiling_pids.values():
            self.procs.add(f"{CEILING}@{pid}", pid)
        try:
            before = self.procs.snapshot()
            t0 = time.perf_counter()
            await asyncio.sleep(seconds)
            after = self.procs.snapshot()
            took = time.perf_counter() - t0
        finally:
            for pid in self.ceiling_pids.values():
                self.procs.remove(f"{CEILING}@{pid}")
        return {k: 1000 * (after[k] - before[k]) / took for k in before}

    @staticmethod
    def net_cpu_ms(run: Run, idle: dict[str, float]) -> float:
        """CPU ms per request of the process that answered, its idle rate over the run subtracted."""
        if not run.server or not run.requests:
            return math.nan
        rate = idle.get(run.server_idle, math.nan)  # ms per second
        return (1000 * run.cpu.get(run.server, math.nan) - rate * run.seconds) / run.requests

    def net_cpu_row(self, section: str, runs: list[Run], idle: dict[str, float]) -> None:
        """One row: the answering process's CPU ms per request, net of idle, for each run."""
        shown = [r for r in runs if r.server]
        self.report.add(
            section,
            "answering process CPU ms/request, net of idle",
            " / ".join(f"{self.net_cpu_ms(r, idle):.2f}" for r in shown),
            " / ".join(f"{r.label} ({r.server})" for r in shown),
        )

    async def floor(self, call: Callable[[], Awaitable[None]], concurrency: int, label: str) -> Run:
        run = await measured_floor(self.procs, call, concurrency, self.seconds, self.margin, label)
        self.runs.append(run)
        return run

    # ------------------------------------------------------------------------------ output
    def add_run(self, section: str, run: Run) -> None:
        bad = f", {run.non2xx} non-2xx" if run.non2xx else ""
        bad += f", {run.socket_errors} socket errors" if run.socket_errors else ""
        self.report.add(section, f"{run.label}: req/s", f"{run.rps:.0f}", f"n={run.requests}{bad}")
        self.report.add(section, f"{run.label}: p50 / p99 ms", f"{ms(run.p50)} / {ms(run.p99)}", run.note)

    def ratio(self, section: str, a: Run, b: Run) -> None:
        self.report.add(section, f"throughput {a.label} / {b.label}", f"{a.rps / b.rps:.3f}")

    def added(self, section: str, a: Run, b: Run) -> None:
        self.report.add(
            section,
            f"added latency p50 / p99 ms: {a.label} − {b.label}",
            f"{ms(a.p50 - b.p50)} / {ms(a.p99 - b.p99)}",
        )

    def cpu_table(self, title: str, runs: list[Run], idle: dict[str, float]) -> None:
        def cell(run: Run, column: str) -> str:
            v = run.cpu_ms(column)
            return "–" if math.isnan(v) or (column == CEILING and column not in run.cpu) else f"{v:.2f}"

        rows = []
        for run in runs:
            total = sum(run.cpu_ms(c) for c in COLUMNS if not math.isnan(run.cpu_ms(c)))
            rows.append([run.label, str(run.requests), *(cell(run, c) for c in COLUMNS), f"{total:.2f}"])
        few = [r.label for r in runs if r.requests < 5 * _concurrency(r)]
        ceilings = [v for k, v in idle.items() if k.startswith(f"{CEILING}@")]
        idle = {**idle, CEILING: max(ceilings)} if ceilings else idle
        rows.append(
            [
                "idle: CPU ms per second (not per request)",
                "",
                *(f"{idle[c]:.1f}" if c in idle and not math.isnan(idle[c]) else "–" for c in COLUMNS),
                f"{sum(v for k, v in idle.items() if k in COLUMNS and not math.isnan(v)):.1f}",
            ]
        )
        note = (
            "utime+stime from /proc over the steady window of each run ÷ requests the server "
            "completed in it; each figure includes the process's idle work (last row)"
        )
        if few:
            note += (
                f"; FEW requests against the concurrency in {', '.join(few)}: the work in flight at "
                "the window's edges weighs on these figures"
            )
        self.report.table(Table(f"CPU ms per request — {title}", ["run", "n", *COLUMNS, "sum"], rows, note))

    def answers_check(self, name: str, runs: list[Run]) -> None:
        bad = [r for r in runs if not r.ok]
        total = sum(r.requests for r in runs)
        detail = f"{total} answers in {len(runs)} runs"
        if bad:
            detail += "; " + "; ".join(
                f"{r.label}: {r.requests} answers, {r.non2xx} non-2xx, {r.socket_errors} socket errors"
                + (f" (first: {r.first_bad[:160]!r})" if r.first_bad else "")
                for r in bad
            )
        self.report.check(name, not bad, detail)
