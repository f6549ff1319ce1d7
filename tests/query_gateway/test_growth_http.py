"""QE-11 against the real stack: the nested-growth class of statements (20 to 30 levels of
`replace`, through CTEs, subqueries, predicates and aggregates) is refused `400
query_too_expensive` on both paths before it runs — ds is never asked — and no PostgreSQL backend
of the datasets database grows: their peak RSS is read from /proc and printed (`-s`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import asyncpg
import httpx
import pytest

from dataplane_local.doubles.ds_connector import DsConnectorDouble
from dataplane_testing.gateway import World, ds_policy, edr_query
from query_gateway.app import create_app
from query_gateway.state import gateway_of

RSS_LIMIT_KB = 256 * 1024


def nested(levels: int, inner: str = "label") -> str:
    expr = inner
    for _ in range(levels):
        expr = f"replace({expr}, substring(label, 1, 1), label)"
    return expr


CLASS = [
    *(f"SELECT length({nested(n)}) AS n FROM stats WHERE id = 1" for n in (20, 25, 30)),
    f"WITH x AS (SELECT {nested(20)} AS v FROM stats) SELECT length(v) AS n FROM x",
    f"SELECT length(v) AS n FROM (SELECT {nested(25)} AS v FROM stats) s",
    f"SELECT count(*) AS n FROM stats WHERE {nested(20)} = 'x'",
    f"SELECT array_agg({nested(20)}) AS n FROM stats",
]


def _peak_rss_kb(pids: list[int]) -> int:
    peak = 0
    for pid in pids:
        status = Path(f"/proc/{pid}/status")
        if not status.exists():
            continue  # a backend that ended meanwhile
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                peak = max(peak, int(line.split()[1]))
    return peak


async def _backends(world: World) -> list[int]:
    conn = await asyncpg.connect(world.datasets_url)
    try:
        name = world.datasets_url.rpartition("/")[2]
        rows = await conn.fetch("SELECT pid FROM pg_stat_activity WHERE datname = $1", name)
        return [int(r["pid"]) for r in rows]
    finally:
        await conn.close()


@pytest.mark.parametrize("sql", CLASS)
async def test_qe11_nested_growth_is_refused_before_it_runs_on_both_paths(
    sql: str, client: httpx.AsyncClient, world: World, ds: DsConnectorDouble
) -> None:
    r = await client.post("/query", json={"sql": sql})
    assert r.status_code == 400, r.text
    assert r.json()["error"] == "query_too_expensive"
    assert "label" not in r.json()["detail"]
    ds.set_policy(ds_policy(["stats"]))
    r = await edr_query(client, world, sql)
    assert r.status_code == 400, r.text
    assert r.json()["error"] == "query_too_expensive"
    assert ds.calls("authorize") == []  # refused before ds is asked


async def test_qe11_no_backend_grows_across_the_class(client: httpx.AsyncClient, world: World) -> None:
    for sql in CLASS:
        for _ in range(3):
            assert (await client.post("/query", json={"sql": sql})).status_code == 400
    # the gateway's own pool is open (an ordinary statement runs), so its backends are measured
    ok = await client.post("/query", json={"sql": "SELECT id, label FROM stats ORDER BY id"})
    assert ok.status_code == 200, ok.text
    pids = await _backends(world)
    assert pids
    peak = _peak_rss_kb(pids)
    print(f"\npeak RSS of {len(pids)} datasets backends after the class: {peak / 1024:.1f} MB")
    assert 0 < peak < RSS_LIMIT_KB


async def test_qe11_a_statements_verdict_is_kept_per_text_and_dropped_by_a_reload(world: World) -> None:
    """The bound is computed once per statement text (it costs about 0.2 ms per request); the
    kept verdict answers the same refusal, and the gateway a catalogue reload builds keeps none
    (the column types the bound reads may have changed)."""
    app = create_app(world.settings())
    async with app.router.lifespan_context(app):
        gw = gateway_of(app.state)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as c:
            refused, ok = CLASS[0], "SELECT id, label FROM stats ORDER BY id"
            first = await c.post("/query", json={"sql": refused})
            assert (await c.post("/query", json={"sql": ok})).status_code == 200
            assert gw.growth_verdicts.get(refused) == first.json()["detail"]
            assert gw.growth_verdicts.get(ok) == ""
            again = await c.post("/query", json={"sql": refused})
            assert (again.status_code, again.json()) == (first.status_code, first.json())
            assert len(gw.growth_verdicts) == 2
        reloaded = dataclasses.replace(gw, entries={})  # what catalogue/reload.py builds
        assert len(reloaded.growth_verdicts) == 0
