"""One running system per test session: `Stack.up` (the code behind `dataplane-local up`) in a
temporary state directory, with two gateway replicas and two resolvers, every service exporting its
spans to an OTLP receiver double started here; stopped (nothing left running) at the end."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from aiokafka import AIOKafkaConsumer

from dataplane_local.demo import StackInfo
from dataplane_local.doubles.otlp_receiver import OtlpReceiver, create_app
from dataplane_local.doubles.server import serve_in_thread
from dataplane_local.procs import record_alive
from dataplane_local.stack import Stack, missing_services

_spec = importlib.util.spec_from_file_location("e2e_support", Path(__file__).with_name("e2e_support.py"))
assert _spec is not None and _spec.loader is not None
support = importlib.util.module_from_spec(_spec)
sys.modules["e2e_support"] = support
_spec.loader.exec_module(support)

# a short resolve deadline keeps the "all resolvers down" scenario quick; it stays far above a
# healthy resolution on this machine (tens of milliseconds)
RESOLVE_TIMEOUT_MS = 4000


@pytest.fixture(scope="session")
async def system() -> AsyncIterator[object]:
    missing = missing_services()
    if missing:
        pytest.fail(f"services not available: {missing}")
    receiver = OtlpReceiver()
    otlp = serve_in_thread(create_app(receiver))
    lines: list[str] = []
    with tempfile.TemporaryDirectory(prefix="dataplane-e2e-") as tmp:
        root = Path(tmp) / "stack"
        stack = Stack(
            root,
            log=lines.append,
            env_overrides={
                "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url,
                "OTEL_BSP_SCHEDULE_DELAY": "200",
                "OTEL_TRACES_SAMPLER": "always_on",
                "ROW_FILTERS_RESOLVE_TIMEOUT_MS": str(RESOLVE_TIMEOUT_MS),
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
                        receiver=receiver,
                        root=root,
                        http=http,
                        kafka=kafka,
                        policy=support.demo_policy(),
                    )
            finally:
                await kafka.stop()
        finally:
            records = stack.pidfile.load()
            await asyncio.to_thread(stack.down)
            otlp.stop()
            left = [f"{r.name} (pid {r.pid})" for r in records if record_alive(r)]
            if left:
                pytest.fail(f"`down` left processes running: {left}")


def stack_env(root: Path) -> dict[str, str]:
    return StackInfo.load(root).env
