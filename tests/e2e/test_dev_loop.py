"""The local dev loop on the whole system (README, "The two commands"): `dataplane-local restart
NAME` replaces one service process of the running stack — same port, same settings — and the
replica serves again once ready, while every other process keeps running."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

from dataplane_local.demo import DEMO_AGREEMENT
from dataplane_local.procs import record_alive
from dataplane_local.timeouts import scaled
from dataplane_testing.e2e import System


async def test_restart_replaces_one_gateway_replica_on_its_port(system: System) -> None:
    name = "query-gateway-2"
    before = {r.name: r for r in system.stack.pidfile.load()}
    url = before[name].url
    result = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "dataplane_local.cli", "--dir", str(system.root), "restart", name],
        capture_output=True,
        text=True,
        timeout=scaled(180),
        check=False,
        env=dict(os.environ),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    after = {r.name: r for r in system.stack.pidfile.load()}
    # the in-process Stack of the session stops what the pid file now names (stop_service, down)
    system.stack.records = list(after.values())
    assert after[name].pid != before[name].pid and after[name].url == url
    assert not record_alive(before[name])
    assert {n: r.pid for n, r in after.items() if n != name} == {
        n: r.pid for n, r in before.items() if n != name
    }
    # the new process serves the dataspace path with the settings it had (EDR, ds, Kafka)
    r = await system.edr_query(DEMO_AGREEMENT, gateway=url)
    assert r.status_code == 200, r.text
    assert r.headers["x-request-id"]
