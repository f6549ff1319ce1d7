"""Where a gateway replica's time goes: the bench system, one path under load, and py-spy sampling
that replica's process (not a test, not part of run.py).

    uv run python bench/profile.py --path edr --seconds 20 --concurrency 1 --out /tmp/edr
    uvx py-spy --version   # py-spy is not a project dependency: `--py-spy` names its command

First prints the gateway process's CPU time per request (from /proc, without py-spy: a figure
that other load on the machine barely moves), `--seconds 0` for only that. Then writes
`<out>-<path>.txt` (py-spy's collapsed stacks, one line per stack with its sample count) and
prints the functions with the most samples, inclusive and self. Needs ptrace permission on the
gateway process (root, or kernel.yama.ptrace_scope=0)."""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import sections
from common import load
from system import AGREEMENT, Bench, Environment, owner

PATHS = ("edr", "dps", "normal")


async def _call(bench: Bench, path: str):  # type: ignore[no-untyped-def]
    gw = bench.gateways[0]
    if path == "normal":
        headers = {"Authorization": f"Bearer {await bench.user_token(owner(42))}"}
        body = {"sql": sections.USER_SQL, "limit": sections.PAGE, "skip_count": True}
        url = f"{gw}/query"
    elif path == "edr":
        token = await bench.edr_token()
        headers = {"Authorization": f"Bearer {token}", "Edc-Contract-Agreement-Id": AGREEMENT}
        body = {"sql": sections.EDR_SQL, "limit": sections.PAGE, "skip_count": True}
        url = f"{gw}/query"
    else:
        from dataplane_local.demo import Wire, control_plane_token, start_pull_flow

        wire = Wire(bench.http)
        cp = await control_plane_token(wire, bench.info)
        flow = await start_pull_flow(wire, bench.info, cp, agreement=AGREEMENT, dataset=sections.TABLE)
        headers = {"Authorization": f"Bearer {flow.token}"}
        body = {"sql": sections.EDR_SQL, "limit": sections.PAGE, "skip_count": True}
        url = f"{gw}/dps/public/query"

    async def call() -> None:
        sections._expect(await bench.http.post(url, json=body, headers=headers))

    return call


def _gateway_pid(bench: Bench) -> int:
    rec = next(r for r in bench.stack.records if r.name == "query-gateway")
    return rec.pid


def cpu_times(pid: int) -> tuple[float, float]:
    """User and system CPU time of one process so far (Linux /proc), seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def cpu_seconds(pid: int) -> float:
    return sum(cpu_times(pid))


def summarise(collapsed: Path, top: int) -> None:
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        for f in set(frames):
            inclusive[f] += n
        own[frames[-1]] += n
    print(f"\n{total} samples")
    for title, counter in (("inclusive", inclusive), ("self", own)):
        print(f"\n-- top {top} {title}")
        for f, n in counter.most_common(top):
            print(f"{100 * n / total:6.1f}%  {f}")


async def main_async(args: argparse.Namespace, root: Path) -> None:
    async with Environment(root, log=lambda s: print(f"[stack] {s}", flush=True)) as bench:
        await asyncio.sleep(3)
        pid = _gateway_pid(bench)
        c0 = cpu_seconds(pid)
        await asyncio.sleep(5)
        print(f"== idle: gateway CPU {1000 * (cpu_seconds(pid) - c0) / 5:.1f} ms per second", flush=True)
        for path in args.path:
            call = await _call(bench, path)
            await load(call, 50, args.concurrency)  # warm
            for _ in range(args.cpu_rounds):
                u0, k0 = cpu_times(pid)
                s = await load(call, args.cpu_requests, args.concurrency)
                u1, k1 = cpu_times(pid)
                used = u1 - u0 + k1 - k0
                print(
                    f"== {path} c={args.concurrency}: gateway CPU {1000 * used / s.n:.2f} ms/request "
                    f"(user {1000 * (u1 - u0) / s.n:.2f}, system {1000 * (k1 - k0) / s.n:.2f}), "
                    f"{s.rps:.0f} req/s, p50 {1000 * s.p50:.2f} ms (n={s.n})",
                    flush=True,
                )
            if args.seconds <= 0:
                continue
            out = Path(f"{args.out}-{path}.txt")
            cmd = [
                *shlex.split(args.py_spy),
                "record",
                "--pid",
                str(_gateway_pid(bench)),
                "--subprocesses",
                "--format",
                "raw",
                "--rate",
                "500",
                "--duration",
                str(args.seconds),
                "--output",
                str(out),
                "--nonblocking",
            ]
            spy = await asyncio.to_thread(
                subprocess.Popen, cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
            )
            await asyncio.sleep(1)
            t0 = time.perf_counter()
            n = 0
            while time.perf_counter() - t0 < args.seconds - 1.5:
                s = await load(call, 100, args.concurrency)
                n += s.n
            took = time.perf_counter() - t0
            await asyncio.to_thread(spy.wait)
            print(f"\n== {path}: {n} requests in {took:.1f}s at c={args.concurrency} ({n / took:.0f} req/s)")
            if await asyncio.to_thread(out.exists):
                summarise(out, args.top)
            else:
                print((spy.stderr.read() if spy.stderr else b"").decode())


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--path", choices=PATHS, action="append", required=True)
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--out", default="/tmp/gateway-profile")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--cpu-rounds", type=int, default=3, help="gateway CPU per request, rounds")
    parser.add_argument("--cpu-requests", type=int, default=300)
    parser.add_argument("--py-spy", default="uvx py-spy", help="how to run py-spy")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dataplane-profile-") as tmp:
        asyncio.run(main_async(args, Path(tmp)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
