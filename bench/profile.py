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

import httpx
import sections
from common import Stats, load
from system import AGREEMENT, Bench, Environment, owner

from dataplane_local import infra

HERE = Path(__file__).resolve().parent

PATHS = ("edr", "dps", "normal")


async def _call(bench: Bench, path: str, gw: str):  # type: ignore[no-untyped-def]
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


_ABSENT = """import importlib.machinery, sys, sysconfig
_BLOCK = set({block!r})
_SITE = sysconfig.get_paths()["purelib"]
class _Absent:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.partition(".")[0] in _BLOCK:
            importlib.machinery.PathFinder.find_spec(name, [p for p in sys.path if p != _SITE])
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, _Absent)
"""


# what a baseline revision brings of its own: a change in the service kit (the HTTP server's
# protocol, logging, spans) is measured as well as one in the gateway
_OURS = ("services/query-gateway/src", "libs/service-kit/src", "libs/contracts/src")


class Baseline:
    """The gateway of another revision, one more process over the same stack (same settings,
    its own port): that revision's gateway, service kit and contracts (`git archive REV`) first
    on PYTHONPATH, and the modules that revision did not depend on made unimportable (a
    sitecustomize)."""

    def __init__(self, root: Path, rev: str, block: list[str]) -> None:
        self.root, self.rev, self.block = root, rev, block
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    async def start(self, bench: Bench) -> str:
        src = self.root / "baseline"
        src.mkdir(parents=True, exist_ok=True)
        archive = await asyncio.to_thread(
            subprocess.run,
            ["git", "archive", self.rev, *_OURS],
            cwd=HERE.parent,
            capture_output=True,
            check=True,
        )
        await asyncio.to_thread(
            subprocess.run, ["tar", "-x", "-C", str(src)], input=archive.stdout, check=True
        )
        site = self.root / "baseline-site"
        site.mkdir(exist_ok=True)
        # absent as when that lock lacked them: a failed import still scans sys.path every time
        await asyncio.to_thread((site / "sitecustomize.py").write_text, _ABSENT.format(block=self.block))
        port = infra.free_port()
        env = {
            **bench.stack.service_envs["query-gateway"],
            "HTTP_PORT": str(port),
            "PYTHONPATH": os.pathsep.join([*(str(src / p) for p in _OURS), str(site)]),
        }
        log = await asyncio.to_thread((self.root / "baseline.log").open, "ab")
        self.proc = await asyncio.to_thread(
            subprocess.Popen,
            [sys.executable, "-c", "from query_gateway.__main__ import main; main()"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.url = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                if (await bench.http.get(f"{self.url}/readyz")).status_code == 200:
                    return self.url
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.1)
        raise RuntimeError(f"the baseline gateway did not become ready; see {self.root / 'baseline.log'}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


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


async def _cpu_round(call, pid: int, n: int, conc: int) -> tuple[Stats, float, float]:  # type: ignore[no-untyped-def]
    u0, k0 = cpu_times(pid)
    s = await load(call, n, conc)
    u1, k1 = cpu_times(pid)
    return s, (u1 - u0) / s.n, (k1 - k0) / s.n


def _line(label: str, s: Stats, user: float, system: float) -> str:
    return (
        f"{label}: gateway CPU {1000 * (user + system):.2f} ms/request "
        f"(user {1000 * user:.2f}, system {1000 * system:.2f}), {s.rps:.0f} req/s, "
        f"p50 {1000 * s.p50:.2f} ms (n={s.n})"
    )


async def main_async(args: argparse.Namespace, root: Path) -> None:
    async with Environment(root, log=lambda s: print(f"[stack] {s}", flush=True)) as bench:
        baseline = Baseline(root, args.baseline, args.baseline_block) if args.baseline else None
        try:
            await _measure(bench, args, baseline)
        finally:
            if baseline is not None:
                await asyncio.to_thread(baseline.stop)


async def _measure(bench: Bench, args: argparse.Namespace, baseline: Baseline | None) -> None:
    await asyncio.sleep(3)
    pid = _gateway_pid(bench)
    c0 = cpu_seconds(pid)
    await asyncio.sleep(5)
    print(f"== idle: gateway CPU {1000 * (cpu_seconds(pid) - c0) / 5:.1f} ms per second", flush=True)
    if baseline is not None:
        await baseline.start(bench)
        assert baseline.proc is not None
        base_pid = baseline.proc.pid
        print(f"== baseline {args.baseline} at {baseline.url} (pid {base_pid})", flush=True)
    for path in args.path:
        call = await _call(bench, path, bench.gateways[0])
        await load(call, 50, args.concurrency)  # warm
        base_call = None
        if baseline is not None:
            base_call = await _call(bench, path, baseline.url)
            await load(base_call, 50, args.concurrency)
        for _ in range(args.cpu_rounds):
            # interleaved, so other load on the machine weighs on both alike
            s, user, system = await _cpu_round(call, pid, args.cpu_requests, args.concurrency)
            print("== " + _line(f"{path} c={args.concurrency} this tree", s, user, system), flush=True)
            if base_call is not None:
                s, user, system = await _cpu_round(base_call, base_pid, args.cpu_requests, args.concurrency)
                print(
                    "== " + _line(f"{path} c={args.concurrency} {args.baseline}", s, user, system), flush=True
                )
        if args.seconds <= 0:
            continue
        out = Path(f"{args.out}-{path}.txt")
        cmd = [
            *shlex.split(args.py_spy),
            "record",
            "--pid",
            str(pid),
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
    parser.add_argument(
        "--baseline", default=None, help="a git revision whose gateway is measured too, interleaved"
    )
    parser.add_argument(
        "--baseline-block",
        default=[],
        action="append",
        help="a module the baseline must not import (one its lock did not have), repeatable",
    )
    parser.add_argument("--py-spy", default="uvx py-spy", help="how to run py-spy")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dataplane-profile-") as tmp:
        asyncio.run(main_async(args, Path(tmp)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
