"""The dataspace story across processes: DPS start on signaling, pull on the gateway, disclosure
through Kafka and the audit relay to ds, suspend; revocation seen by every gateway replica."""

from __future__ import annotations

import asyncio
import re
import sys
from typing import Any

import pytest
from e2e_support import System

from dataplane_local.demo import (
    Wire,
    consenting,
    control_plane_token,
    pull,
    rows_pods,
    run_story,
    signal,
    start_pull_flow,
)

pytestmark = pytest.mark.e2e


async def test_demo_story_holds_end_to_end(system: System) -> None:
    lines: list[str] = []
    result = await run_story(system.info, out=lines.append)
    failed = [f"{name}: {detail}" for name, ok, detail in result.steps if not ok]
    assert result.ok, "\n".join([*failed, "--- transcript ---", *lines[-40:]])
    # the story is the one issue 8 tells: every step ran, ending with the refused pull
    assert [name for name, _, _ in result.steps] == [
        "control plane token",
        "start pull flow",
        "pull serves consenting rows only",
        "ds got a DID-only disclosure",
        "suspend",
        "pull after suspend refused",
    ]
    # nothing printed can be replayed: every token in the transcript is shortened
    assert result.flow is not None and result.flow.token not in "\n".join(lines)


async def test_dps07_suspend_refuses_the_old_token_on_both_gateway_replicas(system: System) -> None:
    assert len(system.gateways) == 2
    wire = Wire(system.http)
    cp = await control_plane_token(wire, system.info)
    flow = await start_pull_flow(wire, system.info, cp)
    pods, _ = consenting()
    for gateway in system.gateways:  # the token is good on every replica while the flow runs
        ok = await pull(wire, f"{gateway}/dps/public", flow.token)
        assert ok.status_code == 200, ok.text
        assert rows_pods(ok) == pods
    suspended = await signal(wire, system.info, cp, flow.flow_id, "suspend")
    assert suspended.status_code == 200, suspended.text
    for gateway in system.gateways:
        refused = await pull(wire, f"{gateway}/dps/public", flow.token)
        body: dict[str, Any] = refused.json()
        assert refused.status_code == 401, (gateway, refused.text)
        assert body["error"] == "pull_token" and "items" not in body


async def test_demo_command_tells_the_story_and_exits_zero(system: System) -> None:
    """`dataplane-local demo` itself: each request printed, tokens redacted, exit status 0."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "dataplane_local.cli",
        "--dir",
        str(system.root),
        "demo",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    text = out.decode()
    assert proc.returncode == 0, text
    assert "the story holds end to end" in text
    posts = [line for line in text.splitlines() if line.strip().startswith("→ POST")]
    for path in (
        "/protocol/openid-connect/token",
        "/dps/v1/dataflows/start",
        "/dps/public/query",
        "/suspend",
    ):
        assert any(path in line for line in posts), (path, text)
    assert "← 401" in text  # the pull after the suspend, as printed
    assert not re.search(r"eyJ[\w-]{20,}\.[\w-]+\.", text)  # no whole token printed
