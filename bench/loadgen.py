"""HTTP load for the bench: wrk (C, `bench/wrk/post.lua`) when installed, else a Python fallback
(httpx, one shared client, in the bench process) — both closed-loop at a fixed number of
connections for a fixed duration, both counting every answer that is not 2xx.

A run lasts `margin + seconds + margin`; the measurement is the window of `seconds` in the
middle, where the load is steady: at each edge of the window the CPU of every benchmarked process
(cpu.Processes, the load generator's own included) is sampled together with the answering
server's own count of requests answered, so "CPU per request" is CPU over the window ÷ requests
the server completed in it (the work in flight at the two edges cancels out in a steady state),
and req/s is that count ÷ the window. The latency percentiles and non-2xx counts are the load
generator's over the whole run. After the run, the server's count is awaited until it stops
moving: the requests still in flight when wrk closed its connections are finished before the
next run starts."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import os
import re
import resource
import shutil
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from common import Stats, load_for
from cpu import Processes

HERE = Path(__file__).resolve().parent
LUA = HERE / "wrk" / "post.lua"
LOADGEN = "load generator"

Counter = Callable[[], Awaitable[float]]


@dataclass(frozen=True)
class Target:
    """One HTTP request repeated: its label, URL, JSON body and headers; `count` reads the
    answering server's own count of requests answered (the measurement window's requests)."""

    label: str
    url: str
    body: bytes
    headers: dict[str, str]
    count: Counter | None = None
    # more servers answering the same request (other replicas): the connections are spread evenly
    # over `url` and these, one load-generator process per server, as a Service spreads them
    also: tuple[str, ...] = ()

    @property
    def urls(self) -> tuple[str, ...]:
        return (self.url, *self.also)


@dataclass
class Run:
    """One measured run: the window's requests and seconds, latency percentiles (seconds) and
    non-2xx counts over the whole run, CPU seconds of each process over the window."""

    label: str
    requests: int
    seconds: float
    p50: float
    p99: float
    non2xx: int = 0
    socket_errors: int = 0
    answers: int = 0  # answers the load generator received over the whole run
    first_bad: str = ""
    cpu: dict[str, float] = field(default_factory=dict)
    note: str = ""
    server: str = ""  # the CPU column of the process that answered (gw-1, ceiling), if any
    server_idle: str = ""  # its key in Harness.idle's answer

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else float("nan")

    @property
    def ok(self) -> bool:
        return self.requests > 0 and self.non2xx == 0 and self.socket_errors == 0

    def cpu_ms(self, name: str) -> float:
        """CPU ms per request of one process over the window (nan: not measured)."""
        seconds = self.cpu.get(name, float("nan"))
        return 1000 * seconds / self.requests if self.requests else float("nan")


def wrk_version() -> str | None:
    """`wrk 4.1.0 ...` when wrk is on PATH, else None."""
    exe = shutil.which("wrk")
    if exe is None:
        return None
    out = subprocess.run([exe, "-v"], capture_output=True, text=True, check=False, timeout=10)
    first = (out.stdout or out.stderr).strip().splitlines()
    text = first[0] if first else "wrk"
    match = re.match(r"wrk\s+(\S+)", text)
    return f"wrk {match.group(1)}" if match else text


def _self_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class Window:
    """The CPU of `procs` (and of the load generator) and a request count, at the two edges."""

    def __init__(self, procs: Processes, count: Counter, loadgen: Callable[[], float] | None) -> None:
        """`loadgen`: the load generator's CPU seconds, when it is not one of `procs`."""
        self.procs, self.count, self.loadgen = procs, count, loadgen
        self.cpu: dict[str, float] = {}
        self.requests = 0
        self.seconds = 0.0

    async def _edge(self) -> tuple[dict[str, float], float, float]:
        n = await self.count()
        cpu = self.procs.snapshot()
        if self.loadgen is not None:
            cpu[LOADGEN] = self.loadgen()
        return cpu, n, time.perf_counter()

    async def measure(self, margin: float, seconds: float) -> None:
        await asyncio.sleep(margin)
        cpu0, n0, t0 = await self._edge()
        await asyncio.sleep(seconds)
        cpu1, n1, t1 = await self._edge()
        self.cpu = {k: cpu1[k] - cpu0[k] for k in cpu0 if k in cpu1}
        self.requests, self.seconds = int(n1 - n0), t1 - t0


async def settle(count: Counter, timeout: float = 60.0) -> float:
    """Until `count` stops moving (two equal reads 0.3 s apart): the seconds it took."""
    t0 = time.perf_counter()
    last = await count()
    while time.perf_counter() - t0 < timeout:
        await asyncio.sleep(0.3)
        now = await count()
        if now == last:
            return time.perf_counter() - t0
        last = now
    return math.nan


class LoadGenerator:
    """Runs `Target`s at a concurrency (connections), sampling `procs`' CPU in the window."""

    def __init__(
        self, workdir: Path, http: httpx.AsyncClient, procs: Processes, python_only: bool = False
    ) -> None:
        """`python_only`: the fallback even where wrk is installed (to compare the two)."""
        self.workdir = workdir
        self.http = http
        self.procs = procs
        self.wrk = None if python_only else shutil.which("wrk")
        self.version = wrk_version() if self.wrk else None
        why = "asked for (--loadgen python)" if python_only else "wrk not installed"
        self.name = (
            f"{self.version} (`bench/wrk/post.lua`)"
            if self.wrk
            else f"Python fallback (httpx, one shared client, in the bench process): {why}"
        )
        self._files: dict[str, tuple[Path, Path]] = {}

    @staticmethod
    def threads(concurrency: int) -> int:
        return 1 if concurrency == 1 else 2

    def _request_files(self, target: Target) -> tuple[Path, Path]:
        """The body and the headers of a target, written once into the state directory."""
        if target.label not in self._files:
            self.workdir.mkdir(parents=True, exist_ok=True)
            slug = re.sub(r"[^A-Za-z0-9]+", "-", target.label).strip("-")
            body, headers = self.workdir / f"{slug}.body", self.workdir / f"{slug}.headers"
            body.write_bytes(target.body)
            lines = {"Content-Type": "application/json", **target.headers}
            headers.write_text("".join(f"{k}: {v}\n" for k, v in lines.items()))
            for p in (body, headers):
                p.chmod(0o600)  # tokens
            self._files[target.label] = (body, headers)
        return self._files[target.label]

    async def run(self, target: Target, concurrency: int, seconds: float, margin: float) -> Run:
        assert target.count is not None, "a measured HTTP target needs the server's count"
        if self.wrk:
            run = await self._wrk(target, concurrency, seconds, margin)
        else:
            run = await self._python(target, concurrency, seconds, margin)
        drained = await settle(target.count)
        if math.isnan(drained):
            run.note = "the server was still answering 60s after the run"
        return run

    def _wrk_command(self, url: str, threads: int, connections: int, duration: int) -> list[str]:
        assert self.wrk is not None
        return [
            self.wrk,
            "-t",
            str(threads),
            "-c",
            str(connections),
            "-d",
            f"{duration}s",
            "--timeout",
            "10s",
            "-s",
            str(LUA),
            url,
        ]

    async def _wrk(self, target: Target, concurrency: int, seconds: float, margin: float) -> Run:
        """One wrk process per server of the target (one, unless `also` names replicas), the
        connections spread evenly; their CPU is the load generator's, their answers summed, the
        percentiles the worst process's (wrk's histograms cannot be merged from its output)."""
        assert self.wrk is not None and target.count is not None
        body, headers = self._request_files(target)
        env = {
            **os.environ,
            "WRK_METHOD": "POST",
            "WRK_BODY_FILE": str(body),
            "WRK_HEADERS_FILE": str(headers),
        }
        duration = math.ceil(seconds + 2 * margin)
        urls = target.urls
        share = max(1, concurrency // len(urls))
        threads = self.threads(concurrency) if len(urls) == 1 else 1
        procs = []
        names = [LOADGEN if i == 0 else f"{LOADGEN} {i + 1}" for i in range(len(urls))]
        try:
            for name, url in zip(names, urls, strict=True):
                proc = await asyncio.create_subprocess_exec(
                    *self._wrk_command(url, threads, share, duration),
                    env=env,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                )
                procs.append(proc)
                self.procs.add(name, proc.pid)
            window = Window(self.procs, target.count, None)
            measured = await asyncio.wait_for(
                asyncio.gather(window.measure(margin, seconds), *(p.communicate() for p in procs)),
                duration + 60,
            )
        except BaseException:
            for proc in procs:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
            raise
        finally:
            for name in names:
                self.procs.remove(name)
        results: list[dict[str, Any]] = []
        for proc, url, (out, err) in zip(procs, urls, measured[1:], strict=True):
            text = out.decode(errors="replace")
            line = next((x for x in text.splitlines() if x.startswith("WRK_JSON ")), None)
            if proc.returncode != 0 or line is None:
                raise RuntimeError(
                    f"wrk failed (rc {proc.returncode}) on {url}: {err.decode(errors='replace')[-500:]}"
                    f" {text[-500:]}"
                )
            results.append(json.loads(line.removeprefix("WRK_JSON ")))
        cpu = dict(window.cpu)
        for name in names[1:]:
            cpu[LOADGEN] = cpu.get(LOADGEN, 0.0) + cpu.pop(name, 0.0)
        fields = ("connect_errors", "read_errors", "write_errors", "timeouts")
        return Run(
            target.label,
            requests=window.requests,
            seconds=window.seconds,
            p50=max(r["p50_us"] for r in results) / 1e6,
            p99=max(r["p99_us"] for r in results) / 1e6,
            non2xx=sum(int(r["non2xx"]) for r in results),
            socket_errors=sum(int(r[f]) for r in results for f in fields),
            answers=sum(int(r["requests"]) for r in results),
            first_bad=next((r["first_bad"] for r in results if r["first_bad"]), ""),
            cpu=cpu,
        )

    async def _python(self, target: Target, concurrency: int, seconds: float, margin: float) -> Run:
        assert target.count is not None
        headers = {"Content-Type": "application/json", **target.headers}
        latencies: list[float] = []
        bad = 0
        socket_errors = 0
        first_bad = ""
        deadline = time.perf_counter() + seconds + 2 * margin
        urls = itertools.cycle(target.urls)

        async def worker() -> None:
            nonlocal bad, socket_errors, first_bad
            while time.perf_counter() < deadline:
                t0 = time.perf_counter()
                try:
                    r = await self.http.post(next(urls), content=target.body, headers=headers)
                except httpx.HTTPError as exc:
                    socket_errors += 1
                    first_bad = first_bad or f"{type(exc).__name__}: {exc}"
                    continue
                latencies.append(time.perf_counter() - t0)
                if not 200 <= r.status_code < 300:
                    bad += 1
                    first_bad = first_bad or f"{r.status_code} {r.text[:300]}"

        window = Window(self.procs, target.count, _self_seconds)
        await asyncio.gather(window.measure(margin, seconds), *(worker() for _ in range(concurrency)))
        s = Stats(latencies=latencies)
        return Run(
            target.label,
            requests=window.requests,
            seconds=window.seconds,
            p50=s.p50,
            p99=s.p99,
            non2xx=bad,
            socket_errors=socket_errors,
            answers=s.n,
            first_bad=first_bad,
            cpu=window.cpu,
        )


async def measured_floor(
    procs: Processes,
    call: Callable[[], Awaitable[None]],
    concurrency: int,
    seconds: float,
    margin: float,
    label: str,
) -> Run:
    """The in-process asyncpg floor, measured the same way (the load generator is then the bench
    process itself: asyncpg's client side; the count is the calls it completed)."""
    stats = Stats()

    async def completed() -> float:
        return float(stats.n)

    window = Window(procs, completed, _self_seconds)
    await asyncio.gather(
        window.measure(margin, seconds), load_for(call, seconds + 2 * margin, concurrency, stats)
    )
    return Run(
        label,
        requests=window.requests,
        seconds=window.seconds,
        p50=stats.p50,
        p99=stats.p99,
        answers=stats.n,
        cpu=window.cpu,
    )
