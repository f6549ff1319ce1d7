"""Issue 15's limits on what one statement may cost, through the gateway's routes against a real
PostgreSQL holding two 200 000-row tables:

- QE-06: a cross join of the two is refused `400 query_too_expensive` on PostgreSQL's estimate,
  before it runs — no backend is seen running it in `pg_stat_activity`, while the same statement
  on a gateway without the guard is seen running there — the detail the estimate only; an
  ordinary indexed query (and a whole-table page) is served; the refusal has its metric and its
  access record;
- QE-07: a dataset's `max_rows` caps the page beside the global cap, the smallest of the touched
  datasets' applies, and the clamp is signalled as QE-01's is (`limit`, `X-Limit-Clamped`);
- QE-08: set-returning functions that generate unbounded rows are refused by the rules."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
import yaml

from dataplane_testing.databases import scratch_database
from dataplane_testing.faults import coded
from dataplane_testing.gateway import World, running_gateway
from dataplane_testing.metrics import scrape
from dataplane_testing.metrics import series as metric
from query_gateway.sql import rules

ROWS = 200_000
SCHEMA = f"""
CREATE TABLE big_a (id int PRIMARY KEY, v int NOT NULL);
CREATE TABLE big_b (id int PRIMARY KEY, w int NOT NULL);
INSERT INTO big_a SELECT g, g % 97 FROM generate_series(1, {ROWS}) g;
INSERT INTO big_b SELECT g, g % 89 FROM generate_series(1, {ROWS}) g;
ANALYZE big_a;
ANALYZE big_b;
"""
MAX_COST = 10_000_000.0
OPEN = {
    "access_level": "open",
    "expose": True,
    "row_filters": {
        "person": {"handler": "allow_all", "binds": "person"},
        "organization": {"handler": "allow_all", "binds": "organization"},
    },
}
DATASETS = [
    {"id": "big_a", "table": "big_a", **OPEN},
    {"id": "big_b", "table": "big_b", **OPEN},
    {"id": "capped_a", "table": "big_a", "max_rows": 5, **OPEN},
    {"id": "capped_b", "table": "big_b", "max_rows": 3, **OPEN},
]
CROSS_JOIN = "SELECT a.id, b.id AS b_id FROM big_a a CROSS JOIN big_b b ORDER BY a.v, b.w"
INDEXED = "SELECT id, v FROM big_a WHERE id = 4242"


@pytest.fixture(scope="module")
async def big(postgres_url: str) -> AsyncIterator[str]:
    async with scratch_database(postgres_url, SCHEMA) as url:
        yield url


@contextlib.asynccontextmanager
async def gateway(
    world: World, url: str, directory: Path, **overrides: Any
) -> AsyncIterator[httpx.AsyncClient]:
    path = directory / "catalogue.yaml"
    path.write_text(yaml.safe_dump({"datasets": DATASETS}))
    settings = world.settings(catalogue_path=str(path), datasets_database_url=url, **overrides)
    async with running_gateway(settings) as client:
        yield client


@pytest.fixture(scope="module")
async def guarded(
    world: World, big: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[httpx.AsyncClient]:
    async with gateway(world, big, tmp_path_factory.mktemp("guarded"), query_max_plan_cost=MAX_COST) as c:
        yield c


def audit_records(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [r.msg for r in caplog.records if r.name == "dataplane.audit" and isinstance(r.msg, dict)]


async def running_statements(url: str, request: Any) -> tuple[httpx.Response, list[str]]:
    """The answer to `request`, and every statement on big_b seen running (not EXPLAINed) in
    pg_stat_activity while it was pending — polled every few milliseconds from another session."""
    seen: list[str] = []
    watcher = await asyncpg.connect(url)
    task = asyncio.ensure_future(request)
    try:
        while not task.done():
            rows = await watcher.fetch(
                "SELECT query FROM pg_stat_activity WHERE state = 'active' AND pid <> pg_backend_pid()"
                " AND datname = current_database()"
            )
            seen += [
                r["query"] for r in rows if "big_b" in r["query"] and not r["query"].startswith("EXPLAIN")
            ]
            await asyncio.sleep(0.005)
        return await task, seen
    finally:
        await watcher.close()


# ---------------------------------------------------------------------------- QE-06
async def test_qe06_a_cross_join_of_two_large_tables_is_refused_before_it_runs(
    guarded: httpx.AsyncClient, big: str, world: World, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dataplane.audit")
    before = metric(
        await scrape(guarded),
        "query_gateway_requests_total",
        route="/query",
        status="400",
        code="query_too_expensive",
    )
    r, seen = await running_statements(big, guarded.post("/query", json={"sql": CROSS_JOIN}))
    assert coded(r) == (400, "query_too_expensive"), r.text
    assert seen == []  # never ran: no backend was busy with it
    detail = r.json()["detail"]
    estimate = float(re.findall(r"estimated cost (\d+)", detail)[0])
    assert estimate > MAX_COST
    # the estimate and the limit, nothing of the plan (no table, index or node name)
    assert "big_" not in detail and "Scan" not in detail and "Join" not in detail and "Loop" not in detail
    after = metric(
        await scrape(guarded),
        "query_gateway_requests_total",
        route="/query",
        status="400",
        code="query_too_expensive",
    )
    assert after == before + 1
    records = [rec for rec in audit_records(caplog) if rec["reason"] == "query_too_expensive"]
    assert sorted(rec["resource"] for rec in records) == ["big_a", "big_b"]
    # with skip_count too: the whole statement's estimate, whatever the page
    r = await guarded.post("/query", json={"sql": CROSS_JOIN, "skip_count": True, "limit": 1})
    assert coded(r) == (400, "query_too_expensive")


async def test_qe06_without_the_guard_the_same_cross_join_is_seen_running(
    world: World, big: str, tmp_path: Path
) -> None:
    """The observation of the test above is able to see the statement: unguarded, it runs until
    the statement timeout stops it."""
    async with gateway(
        world, big, tmp_path, query_statement_timeout_ms=1_500, query_plan_cost_calibrate=False
    ) as unguarded:
        r, seen = await running_statements(big, unguarded.post("/query", json={"sql": CROSS_JOIN}))
    assert coded(r) == (400, "query_timeout")
    assert seen


async def test_qe06_an_ordinary_indexed_query_and_a_whole_table_page_are_served(
    guarded: httpx.AsyncClient,
) -> None:
    r = await guarded.post("/query", json={"sql": INDEXED})
    assert r.status_code == 200, r.text
    assert r.json()["items"] == [{"id": 4242, "v": 4242 % 97}]
    r = await guarded.post("/query", json={"sql": "SELECT id FROM big_b ORDER BY id", "limit": 3})
    assert r.status_code == 200, r.text
    assert (r.json()["items"], r.json()["total"]) == ([{"id": 1}, {"id": 2}, {"id": 3}], ROWS)
    # a join on the key is an ordinary query too
    joined = "SELECT a.id FROM big_a a JOIN big_b b ON b.id = a.id WHERE a.id < 10 ORDER BY a.id"
    r = await guarded.post("/query", json={"sql": joined})
    assert r.status_code == 200 and [i["id"] for i in r.json()["items"]] == list(range(1, 10)), r.text


# ---------------------------------------------------------------------------- QE-07
async def test_qe07_a_datasets_max_rows_caps_the_page_and_the_clamp_is_signalled(
    guarded: httpx.AsyncClient,
) -> None:
    r = await guarded.post("/query", json={"sql": "SELECT id FROM capped_a ORDER BY id", "limit": 100})
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["limit"], body["count"], body["total"]) == (5, 5, ROWS)
    assert r.headers["X-Limit-Clamped"] == "100"
    # under the cap: as asked, no header
    r = await guarded.post("/query", json={"sql": "SELECT id FROM capped_a ORDER BY id", "limit": 2})
    assert (r.json()["limit"], "X-Limit-Clamped" in r.headers) == (2, False)
    # the smallest cap of the touched datasets applies
    both = "SELECT a.id FROM capped_a a JOIN capped_b b ON b.id = a.id ORDER BY a.id"
    r = await guarded.post("/query", json={"sql": both, "limit": 10})
    assert (r.json()["limit"], r.json()["count"], r.headers["X-Limit-Clamped"]) == (3, 3, "10")
    # a dataset without one keeps the global cap
    r = await guarded.post("/query", json={"sql": "SELECT id FROM big_a", "limit": 20_000})
    assert (r.json()["limit"], r.headers["X-Limit-Clamped"]) == (10_000, "20000")


# ---------------------------------------------------------------------------- QE-08
@pytest.mark.parametrize(
    ("sql", "detail"),
    [
        ("SELECT * FROM generate_series(1, 1000000000) g", "Table functions are not allowed"),
        ("SELECT a.id FROM big_a a, generate_series(1, 1000000000) g", "Table functions are not allowed"),
        ("SELECT generate_series(1, 1000000000) FROM big_a", "(unbounded rows): GENERATE_SERIES"),
        (
            "SELECT id, generate_subscripts(ARRAY[1, 2], 1) FROM big_a",
            "(unbounded rows): GENERATE_SUBSCRIPTS",
        ),
        ("SELECT unnest(ARRAY[1, 2]) FROM big_a", "(unbounded rows): UNNEST"),
        ("SELECT repeat('x', 1000000000) FROM big_a", "(unbounded rows): REPEAT"),
        ("SELECT lpad('x', 1000000000) FROM big_a", "(unbounded rows): LPAD/RPAD"),
    ],
)
async def test_qe08_unbounded_set_returning_functions_are_refused(
    guarded: httpx.AsyncClient, sql: str, detail: str
) -> None:
    r = await guarded.post("/query", json={"sql": sql})
    assert coded(r) == (400, "sql_refused"), r.text
    assert r.json()["detail"].endswith(detail), r.text


def test_qe08_no_unbounded_generator_is_ever_allowlisted() -> None:
    assert not rules.UNBOUNDED_GENERATORS & rules.FUNCTION_ALLOWLIST
    assert {"generate_series", "generate_subscripts", "unnest", "repeat"} <= rules.UNBOUNDED_GENERATORS
