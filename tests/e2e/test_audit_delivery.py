"""RF-10 across processes: disclosures published while the audit relay is down are delivered to
ds, every one of them, once the relay is back."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from dataplane_local.demo import DEMO_AGREEMENT
from dataplane_testing.e2e import System

QUERIES = 6

pytestmark = pytest.mark.e2e


async def test_rf10_relay_stopped_while_serving_then_ds_receives_every_disclosure(system: System) -> None:
    transfers = [f"tp-outage-{uuid.uuid4().hex[:10]}" for _ in range(QUERIES)]
    await asyncio.to_thread(system.stack.stop_service, "audit-relay")
    try:
        for i, transfer in enumerate(transfers):  # served by both replicas while the relay is down
            r = await system.edr_query(DEMO_AGREEMENT, gateway=system.gateways[i % 2], transfer_id=transfer)
            assert r.status_code == 200, r.text
        assert not set(transfers) & await system.audit_transfer_ids()  # nobody delivered them yet
    finally:
        await asyncio.to_thread(system.stack.start_service, "audit-relay", 120.0)
    delivered = await system.delivered(set(transfers))
    assert delivered == set(transfers), f"missing: {sorted(set(transfers) - delivered)}"
