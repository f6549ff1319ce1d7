"""QE-10 against the real stack, with the share's defaults from the code: a gateway process of
its own (the suite's replicas raise the share for the reconciliation's many clients of one
consumer). Consumer A floods it with slow statements — twelve at once, each holding a pooled
connection until it ends or the statement timeout stops it — and consumer B's one-row query is
served meanwhile, as before the flood. A's statements past its share are refused `429
too_many_concurrent_queries` with `Retry-After`, before they ask for a connection.

The latencies are printed (`-s`), not asserted: tests carry no timing thresholds."""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid

import httpx
import pytest

from dataplane_local.demo import DEMO_AGREEMENT, DEMO_CONSUMER
from dataplane_testing.e2e import POD_SQL, System
from dataplane_testing.metrics import sample
from query_gateway.settings import Settings

pytestmark = pytest.mark.e2e

OTHER_CONSUMER = "did:web:share-other.example"
FLOOD = 12
# a five-way cross join of the demo dataset's consented rows (48 of them: 250 million rows to
# count) — held until the statement timeout stops it
SLOW_SQL = "SELECT count(*) AS n FROM " + ", ".join(f"meter_readings t{i}" for i in range(5))
EIGHT_WAY_SQL = "SELECT count(*) AS n FROM " + ", ".join(f"meter_readings t{i}" for i in range(8))
SHARE = Settings.model_fields["query_max_concurrent_per_consumer"].default
TOTAL = Settings.model_fields["query_max_concurrent_per_consumer_total"].default


async def _other_agreement(system: System) -> tuple[str, str]:
    name = f"agr-share-{uuid.uuid4().hex[:10]}"
    datasets = system.policy["agreements"][DEMO_AGREEMENT]["datasets"]
    system.policy["agreements"][name] = {"consumer": OTHER_CONSUMER, "datasets": datasets}
    await system.ds_control({"action": "policy", "policy": system.policy})
    minted = await system.ds_control({"action": "mint_edr", "consumer": OTHER_CONSUMER, "agreement": name})
    return name, str(minted["token"])


async def _timed(
    system: System, gateway: str, agreement: str, token: str, sql: str
) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    r = await system.edr_query(agreement, gateway=gateway, sql=sql, token=token)
    return r, time.monotonic() - started


async def test_qe10_one_consumer_flooding_slow_statements_leaves_the_pool_to_another(system: System) -> None:
    assert SHARE > 0 and TOTAL > 0, "QE-10's share is on by default"
    instance = await asyncio.to_thread(
        system.stack.add_instance,
        "query-gateway",
        {
            "QUERY_MAX_CONCURRENT_PER_CONSUMER": str(SHARE),
            "QUERY_MAX_CONCURRENT_PER_CONSUMER_TOTAL": str(TOTAL),
            # the guard under test is the share: the cost guard would refuse the slow statement
            # before it holds anything
            "QUERY_PLAN_COST_CALIBRATE": "false",
            "QUERY_MAX_PLAN_COST": "0",
        },
    )
    try:
        gateway = system.instance_urls()[instance]
        a_token = await system.edr_token(DEMO_AGREEMENT)
        b_agreement, b_token = await _other_agreement(system)
        before = [await _timed(system, gateway, b_agreement, b_token, POD_SQL) for _ in range(5)]
        assert [r.status_code for r, _ in before] == [200] * 5, [r.text for r, _ in before]

        flood_started = time.monotonic()
        flood = [
            asyncio.create_task(_timed(system, gateway, DEMO_AGREEMENT, a_token, SLOW_SQL))
            for _ in range(FLOOD)
        ]
        await asyncio.sleep(0.5)  # A's statements are running
        during = [await _timed(system, gateway, b_agreement, b_token, POD_SQL) for _ in range(5)]
        b_done = time.monotonic()
        answers = await asyncio.gather(*flood)

        assert [r.status_code for r, _ in during] == [200] * 5, [r.text for r, _ in during]
        assert all(r.json()["items"] == before[0][0].json()["items"] for r, _ in during)
        refused = [r for r, _ in answers if r.status_code == 429]
        ran = [r for r, _ in answers if r.status_code != 429]
        assert len(ran) == SHARE, [r.text for r, _ in answers]
        for r in refused:
            assert r.json()["error"] == "too_many_concurrent_queries" and "items" not in r.json()
            assert r.headers["Retry-After"] == "1"
            assert DEMO_CONSUMER not in r.text
        for r in ran:
            assert r.status_code == 200 or r.json()["error"] == "query_timeout", r.text
        slow = max(t for r, t in answers if r.status_code != 429)
        assert b_done < flood_started + slow, "B's queries ended after A's statements: nothing was shown"
        print(
            f"\nQE-10 share {SHARE}/replica, total {TOTAL}: A {len(ran)} ran (slowest {slow:.2f} s), "
            f"{len(refused)} refused 429; B before the flood median "
            f"{1000 * statistics.median(t for _, t in before):.1f} ms, during it median "
            f"{1000 * statistics.median(t for _, t in during):.1f} ms, "
            f"max {1000 * max(t for _, t in during):.1f} ms"
        )
    finally:
        await asyncio.to_thread(system.stack.remove_instance, instance)


async def test_qe06_the_slow_statement_is_refused_before_it_runs_by_the_calibrated_guard(
    system: System,
) -> None:
    """The suite's replicas run the cost guard as the code sets it (calibrated at start-up): an
    eight-way cross join of the demo dataset (its estimate ~10^11 cost units, where the five-way
    one's ~4 million sits within a factor of a few of a fast host's limit) is refused before it
    holds a connection, on both replicas."""
    token = await system.edr_token(DEMO_AGREEMENT)
    for gateway in system.gateways:
        r, _ = await _timed(system, gateway, DEMO_AGREEMENT, token, EIGHT_WAY_SQL)
        assert r.status_code == 400 and r.json()["error"] == "query_too_expensive", r.text
        assert "meter_readings" not in r.json()["detail"]
        metrics = (await system.http.get(f"{gateway}/metrics")).text
        assert sample(metrics, "query_gateway_plan_cost_per_ms") > 0
