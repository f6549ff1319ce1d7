"""RF-10 reconciled from outside (issue 35): closed-loop clients with no pause query both gateway
replicas on the EDR path, each answer with a transfer id of its own. Afterwards three counts must
agree: the answers 200, the disclosures on the audit topic, and the disclosures ds accepted (its
double's record of audit calls). A served query whose disclosure never reaches ds fails it.

CI runs a size that fits (`DATAPLANE_RECONCILE_QUERIES`, default 1 500); the 100 000-event runs
set it higher. The figures are printed (`-s`)."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import pytest

from dataplane_contracts.topics import AUDIT_DISCLOSURES
from dataplane_local.demo import DEMO_AGREEMENT
from dataplane_testing.e2e import System
from dataplane_testing.metrics import sample
from dataplane_testing.polling import eventually
from dataplane_testing.topics import ends_of

QUERIES = int(os.environ.get("DATAPLANE_RECONCILE_QUERIES", "1500"))
CLIENTS = 24

pytestmark = pytest.mark.e2e


async def test_rf10_answers_200_equal_events_on_the_topic_equal_posts_ds_accepted(system: System) -> None:
    token = await system.edr_token(DEMO_AGREEMENT)
    run = uuid.uuid4().hex[:8]
    prefix = f"tp-reconcile-{run}-"
    numbers = itertools.count()
    served: list[str] = []
    others: dict[int, int] = {}

    async def client(gateway: str) -> None:
        while (n := next(numbers)) < QUERIES:
            transfer = f"{prefix}{n}"
            try:
                r = await system.edr_query(DEMO_AGREEMENT, gateway=gateway, transfer_id=transfer, token=token)
            except httpx.TransportError:
                others[0] = others.get(0, 0) + 1
                continue
            if r.status_code == 200:
                served.append(transfer)
            else:  # refused or failed: no rows left, so no disclosure is owed
                others[r.status_code] = others.get(r.status_code, 0) + 1

    bootstrap = system.info.env["KAFKA_BOOTSTRAP_SERVERS"]
    starts = await ends_of(bootstrap, AUDIT_DISCLOSURES)
    # the topic read record by record beside the burst, by a process of its own (why there:
    # dataplane_testing/topic_witness.py)
    work = Path(tempfile.mkdtemp(prefix="reconcile-witness-"))
    ids = work / "ids"
    reader = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "dataplane_testing.topic_witness", bootstrap, AUDIT_DISCLOSURES, prefix),
        *(json.dumps(starts), str(ids)),
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])},
    )
    try:
        started = time.monotonic()
        await asyncio.gather(*(client(system.gateways[i % 2]) for i in range(CLIENTS)))
        elapsed = time.monotonic() - started
        delivered = await system.delivered(set(served), timeout=120 + QUERIES / 50)
        await eventually(lambda: _lines(ids) >= len(served), 120 + QUERIES / 100, 0.5)
    finally:
        reader.terminate()  # it stops once idle a moment: what is still arriving is read
        try:
            await asyncio.wait_for(reader.wait(), 30)
        except TimeoutError:
            reader.kill()
            await reader.wait()
    published = ids.read_text().split() if ids.exists() else []
    on_topic = len(published)
    relay = system.instance_urls()["audit-relay"]
    metrics = (await system.http.get(f"{relay}/metrics")).text
    gaps = sample(metrics, "audit_relay_offset_gaps_total")
    jumps = sample(metrics, "audit_relay_fetch_jumps_total")
    print(
        f"\n{QUERIES} queries by {CLIENTS} clients in {elapsed:.1f} s ({QUERIES / elapsed:.0f}/s): "
        f"{len(served)} answered 200, other answers {others or 'none'}; {on_topic} disclosures on "
        f"the topic, {len(delivered)} accepted by ds; "
        f"relay: offset gaps at commit {gaps:g}, fetch jumps fetched again {jumps:g}"
    )
    assert len(served) == len(set(served))
    assert delivered == set(served), f"{len(set(served) - delivered)} served, never reached ds"
    # nothing published but the ones served (every refusal happens before the disclosure)
    assert sorted(published) == sorted(served)
    assert len(served) >= QUERIES * 0.9, others  # a run mostly refused proves nothing
    assert gaps == 0  # no commit was ever about to pass an offset neither delivered nor a hole


def _lines(path: Path) -> int:
    return len(path.read_text().split()) if path.exists() else 0
