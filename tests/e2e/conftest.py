"""One running system per test session: `Stack.up` (the code behind `dataplane-local up`) in a
temporary state directory, with two gateway replicas and two resolvers, every service exporting its
spans to the stack's own OTLP receiver (read back from its span store); stopped at the end, where
`down` must exit 0 and no process the stack started — nor any process those started — may survive
it."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from aiokafka import AIOKafkaConsumer

from dataplane_local.demo import StackInfo
from dataplane_local.procs import process_tree, survivors
from dataplane_local.stack import TRACES_FILE, Stack, missing_services
from dataplane_local.traces import StoredSpans
from dataplane_testing import e2e as support

# a short resolve deadline keeps the "all resolvers down" scenario quick; it stays far above a
# healthy resolution on this machine (tens of milliseconds)
RESOLVE_TIMEOUT_MS = 4000


@pytest.fixture(scope="session")
async def system() -> AsyncIterator[object]:
    missing = missing_services()
    if missing:
        pytest.fail(f"services not available: {missing}")
    lines: list[str] = []
    with tempfile.TemporaryDirectory(prefix="dataplane-e2e-") as tmp:
        root = Path(tmp) / "stack"
        stack = Stack(
            root,
            log=lines.append,
            env_overrides={
                "OTEL_BSP_SCHEDULE_DELAY": "200",
                "OTEL_TRACES_SAMPLER": "always_on",
                "ROW_FILTERS_RESOLVE_TIMEOUT_MS": str(RESOLVE_TIMEOUT_MS),
                # issue 13: the http-pull profile beside HttpData-PULL, renewal clients' did:web
                # documents from the in-test double (plain HTTP, a port)
                "DPS_TRANSFER_TYPES": '["HttpData-PULL", "http-pull"]',
                "DPS_DID_WEB_ALLOW_HTTP": "true",
                # GS-14: the demo catalogue plus a rate-limited dataset of its own
                "CATALOGUE_PATH": str(support.e2e_catalogue(Path(tmp))),
                # QE-10: the reconciliation's 24 closed-loop clients are one consumer; the share's
                # default is proved on a gateway of its own (test_consumer_share.py)
                "QUERY_MAX_CONCURRENT_PER_CONSUMER": "16",
                "QUERY_MAX_CONCURRENT_PER_CONSUMER_TOTAL": "32",
            },
        )
        # `up` runs its own event loops (asyncio.run): keep them off the test session's loop
        rc = await asyncio.to_thread(stack.up, False, False, 120.0, 2, 2)
        try:
            if rc != 0:
                pytest.fail("the local stack did not start:\n" + "\n".join(lines[-30:]))
            kafka = AIOKafkaConsumer(bootstrap_servers=stack_env(root)["KAFKA_BOOTSTRAP_SERVERS"])
            await kafka.start()
            try:
                async with httpx.AsyncClient(timeout=30.0) as http:
                    yield support.System(
                        stack=stack,
                        info=StackInfo.load(root),
                        receiver=StoredSpans(root / TRACES_FILE),
                        root=root,
                        http=http,
                        kafka=kafka,
                        policy=support.demo_policy(),
                    )
            finally:
                await kafka.stop()
        finally:
            # taken while everything runs: afterwards a survivor re-parented to init would no
            # longer be found under the pids `down` knows about
            started = process_tree([r.pid for r in stack.pidfile.load()])
            down_rc = await asyncio.to_thread(stack.down)
            left = await _survivors_of(started)
            if down_rc != 0 or left:
                pytest.fail(
                    f"`down` exited {down_rc} and left {len(left)} processes running "
                    f"({_describe(left)}):\n" + "\n".join(lines[-10:])
                )


async def _survivors_of(started: dict[int, str | None]) -> list[int]:
    """What still runs of the snapshot. `down` waits for each process group it signals; a
    process outside those groups gets a moment to finish exiting (bounded against a hang only)."""
    for _ in range(100):
        left = survivors(started)
        if not left:
            return []
        await asyncio.sleep(0.1)
    return survivors(started)


def _describe(pids: list[int]) -> str:
    out = []
    for pid in pids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            cmd = "?"
        out.append(f"{pid}: {cmd.strip()[:120]}")
    return "; ".join(out)


def stack_env(root: Path) -> dict[str, str]:
    return StackInfo.load(root).env
