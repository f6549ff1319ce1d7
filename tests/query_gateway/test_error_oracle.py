# ruff: noqa: E501 - SQL test data reads best on one line
"""Issue 19, the error oracle: the row filter is a barrier on every narrowed path. Issue 15: so is
a narrowing that lists a dataset's exposed columns, and a statement naming an unexposed column is
refused alike on every path, with the forbidden row or without it, the column or a missing one.

A statement whose predicate raises on one chosen value (a division by zero, a failing cast) must
get the same answer whether or not a row the caller may not read holds that value. Two gateways
run side by side over databases A and B, identical but for one forbidden row that only A holds
(pod `pod-x`, owner `user-x`, secret `target`, reading 77.25); every statement is sent to both,
at least 8 times each, through the normal path, the legacy EDR path and the DPS pull. The datasets
database pool has one connection, so every repetition runs on the same prepared statement and
the generic plan is reached (asyncpg prepares, PostgreSQL switches after five custom plans).
One table is unindexed (the filter is a qual of a sequential scan, where cost ordering decided
the leak), one indexed on the filter columns.

`test_the_statements_detect_an_unfenced_narrowing` shows the statements and data can see the
leak: the same narrowed text with the barrier removed, run directly on A and B, answers
differently."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest
import yaml

from dataplane_local.doubles.ds_connector import DsConnectorDouble
from dataplane_testing.databases import scratch_database
from dataplane_testing.gateway import (
    AGREEMENT,
    PUBLIC_PEM,
    PULL_GRANTS_DDL,
    World,
    ds_policy,
    pull_token,
    running_gateway,
    started_grant,
)

TABLES = {"oracle.plain": "oracle_plain", "oracle.indexed": "oracle_indexed"}
REPEAT = 9  # > 5 custom plans, on one connection
KEY_COUNTS = (1, 8, 40)
ALLOWED_PODS = [f"pod-{i}" for i in range(1, 41)]
EMPTY_BY_DESIGN = {"pod equality first"}  # asks for the forbidden row's own pod

SCHEMA = "\n".join(
    f"""
CREATE TABLE {table} (id integer PRIMARY KEY, pod text NOT NULL, owner text NOT NULL,
                      secret text NOT NULL, reading numeric NOT NULL);
INSERT INTO {table}
  SELECT i, 'pod-' || (i % 400), 'user-' || (i % 300), 's' || i, (i % 50) + 0.5
  FROM generate_series(1, 4000) AS i;
"""
    for table in TABLES.values()
) + ("CREATE INDEX ON oracle_indexed (pod); CREATE INDEX ON oracle_indexed (owner);" + PULL_GRANTS_DDL)
FORBIDDEN = "INSERT INTO {table} VALUES (99999, 'pod-x', 'user-x', 'target', 77.25)"

RAISE = "1 / (CASE WHEN {c} THEN 0 ELSE 1 END) = 1"
STATEMENTS = {
    "where division": "SELECT t.id FROM {d} t WHERE " + RAISE.format(c="t.secret = 'target'"),
    "where cast": "SELECT t.id FROM {d} t WHERE CAST(CASE WHEN t.secret = 'target' THEN 'x' ELSE '1' END AS INT) = 1",
    "where numeric range": "SELECT t.id FROM {d} t WHERE " + RAISE.format(c="t.reading > 77.2 AND t.reading < 77.3"),
    "join on": "SELECT a.id FROM {d} a JOIN {d} b ON a.id = b.id AND " + RAISE.format(c="b.secret = 'target'"),
    "having on a group key": "SELECT t.secret, count(*) AS n FROM {d} t GROUP BY t.secret HAVING "
    + RAISE.format(c="t.secret = 'target'"),
    "materialized cte": "WITH c AS MATERIALIZED (SELECT * FROM {d} x WHERE "
    + RAISE.format(c="x.secret = 'target'")
    + ") SELECT c.id FROM c",
    "inlined cte": "WITH c AS (SELECT * FROM {d}) SELECT c.id FROM c WHERE " + RAISE.format(c="c.secret = 'target'"),
    "derived table": "SELECT s.id FROM (SELECT * FROM {d} x) s WHERE " + RAISE.format(c="s.secret = 'target'"),
    "in subquery": "SELECT t.id FROM {d} t WHERE t.id IN (SELECT y.id FROM {d} y WHERE "
    + RAISE.format(c="y.secret = 'target'")
    + ")",
    "pod equality first": "SELECT t.id FROM {d} t WHERE t.pod = 'pod-x' AND " + RAISE.format(c="t.secret = 'target'"),
}  # fmt: skip

CATALOGUE = {
    "datasets": [
        {
            "id": ds_id,
            "table": table,
            "access_level": "open",
            "expose": True,
            "dataspace_expose": True,
            "row_filters": {
                # normal path: a person reads their own rows; the dataspace paths: ds's filter
                "person": {"handler": "direct_user_match", "args": {"column": "owner"}},
                "organization": {"handler": "allow_all", "binds": "organization"},
            },
        }
        for ds_id, table in TABLES.items()
    ]
}

# Issue 15: a dataset over the unindexed table exposing id, pod and reading. `secret`, which the
# statements aim at, and `owner`, the normal path's filter column, are not exposed.
NARROW = "oracle.narrow"
CATALOGUE["datasets"].append({**CATALOGUE["datasets"][0], "id": NARROW, "columns": ["id", "pod", "reading"]})


@pytest.fixture(scope="module")
async def databases(postgres_url: str) -> AsyncIterator[tuple[str, str]]:
    """A holds the forbidden row in each table, B does not; otherwise the two are the same."""
    forbidden = ";".join(FORBIDDEN.format(table=table) for table in TABLES.values())
    async with (
        scratch_database(postgres_url, f"{SCHEMA};{forbidden};ANALYZE") as a,
        scratch_database(postgres_url, f"{SCHEMA};ANALYZE") as b,
    ):
        yield a, b


@pytest.fixture(scope="module")
async def gateways(
    world: World, databases: tuple[str, str], tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient]]:
    path = tmp_path_factory.mktemp("oracle") / "catalogue.yaml"
    path.write_text(yaml.safe_dump(CATALOGUE))
    a_url, b_url = databases

    def settings(url: str) -> Any:
        return world.settings(
            catalogue_path=str(path),
            datasets_database_url=url,
            datasets_pool_max_size=1,
            dps_enabled=True,
            dps_token_public_key=PUBLIC_PEM,
            dps_flows_database_url=a_url,  # one grant table for both gateways
        )

    async with running_gateway(settings(a_url)) as a, running_gateway(settings(b_url)) as b:
        yield a, b


def answer(r: httpx.Response) -> tuple[int, Any]:
    body = r.json()
    return r.status_code, body.get("items") if r.status_code == 200 else body.get("error")


async def same_answers(
    a: httpx.AsyncClient, b: httpx.AsyncClient, path: str, sql: str, headers: dict[str, str]
) -> tuple[int, Any]:
    first: tuple[int, Any] | None = None
    for _ in range(REPEAT):
        got_a = answer(await a.post(path, json={"sql": sql, "limit": 10_000}, headers=headers))
        got_b = answer(await b.post(path, json={"sql": sql, "limit": 10_000}, headers=headers))
        assert got_a == got_b, f"{path}: with the forbidden row {got_a[:1]}, without {got_b[:1]}"
        first = first or got_a
    assert first is not None
    return first


def verdicts(keys: int) -> dict[str, Any]:
    row_filter = {
        "handler": "subject_key_match",
        "args": {"column": "pod", "key_type": "pod"},
        "keys": [f"pod:{p}" for p in ALLOWED_PODS[:keys]],
        "subject_dids": ["did:web:subject.example"],
    }
    return ds_policy([{"dataset_id": d, "row_filter": row_filter} for d in TABLES])


@pytest.mark.parametrize("statement", STATEMENTS)
@pytest.mark.parametrize("dataset", TABLES)
async def test_normal_path_answers_the_same_with_and_without_a_forbidden_row(
    gateways: tuple[httpx.AsyncClient, httpx.AsyncClient], world: World, dataset: str, statement: str
) -> None:
    a, b = gateways
    headers = {"Authorization": f"Bearer {world.user_token('user-7')}"}
    status, items = await same_answers(a, b, "/query", STATEMENTS[statement].format(d=dataset), headers)
    assert status == 200, items  # the caller's own rows hold no `target`: the statement succeeds
    assert items or statement in EMPTY_BY_DESIGN


@pytest.mark.parametrize("keys", KEY_COUNTS)
@pytest.mark.parametrize("statement", STATEMENTS)
@pytest.mark.parametrize("dataset", TABLES)
async def test_edr_path_answers_the_same_with_and_without_a_forbidden_row(
    gateways: tuple[httpx.AsyncClient, httpx.AsyncClient],
    world: World,
    ds: DsConnectorDouble,
    dataset: str,
    statement: str,
    keys: int,
) -> None:
    a, b = gateways
    ds.set_policy(verdicts(keys))
    headers = {"Authorization": f"Bearer {world.edr()}", "Edc-Contract-Agreement-Id": AGREEMENT}
    status, items = await same_answers(a, b, "/query", STATEMENTS[statement].format(d=dataset), headers)
    assert status == 200, items
    assert items or statement in EMPTY_BY_DESIGN


async def _pull_grant(url: str, dataset: str) -> str:
    return pull_token(await started_grant(url, dataset))


@pytest.mark.parametrize("keys", (1, 40))
@pytest.mark.parametrize("statement", STATEMENTS)
@pytest.mark.parametrize("dataset", TABLES)
async def test_dps_pull_answers_the_same_with_and_without_a_forbidden_row(
    gateways: tuple[httpx.AsyncClient, httpx.AsyncClient],
    databases: tuple[str, str],
    ds: DsConnectorDouble,
    dataset: str,
    statement: str,
    keys: int,
) -> None:
    a, b = gateways
    ds.set_policy(verdicts(keys))
    headers = {"Authorization": f"Bearer {await _pull_grant(databases[0], dataset)}"}
    sql = STATEMENTS[statement].format(d=dataset)
    status, items = await same_answers(a, b, "/dps/public/query", sql, headers)
    assert status == 200, items
    assert items or statement in EMPTY_BY_DESIGN


async def test_the_statements_detect_an_unfenced_narrowing(
    gateways: tuple[httpx.AsyncClient, httpx.AsyncClient], world: World, databases: tuple[str, str]
) -> None:
    """The control: without `OFFSET 0`, the same narrowed statements leak on the unindexed table
    — an error on A, rows on B — so the comparisons above can fail. The allow-list bound here
    names eight owners (none of them the forbidden row's): with that many, PostgreSQL costs the
    filter above the caller's predicate even on a custom plan."""
    a, _ = gateways
    headers = {"Authorization": f"Bearer {world.user_token('user-7')}"}
    leaks = 0
    conns = [await asyncpg.connect(url) for url in databases]
    try:
        for template in STATEMENTS.values():
            r = await a.post("/query/plan", json={"sql": template.format(d="oracle.plain")}, headers=headers)
            assert r.status_code == 200, r.text
            fenced = r.json()["sql"]
            assert fenced.count("OFFSET 0") == fenced.count("AS _dp_rf")
            unfenced = fenced.replace(" OFFSET 0", "")
            outcomes = []
            for conn in conns:
                try:
                    for _ in range(REPEAT):
                        await conn.fetch(unfenced, [f"user-{i}" for i in range(1, 9)])
                    outcomes.append("rows")
                except asyncpg.DataError:
                    outcomes.append("error")
            leaks += outcomes == ["error", "rows"]
    finally:
        for conn in conns:
            await conn.close()
    print(f"{leaks} of {len(STATEMENTS)} statements leak without the barrier")
    assert leaks >= 6, f"only {leaks} statements leak without the barrier"


# Issue 30: statements whose every qual is leakproof run without the barrier; each probes the
# forbidden row with a comparison PostgreSQL may evaluate before the filter, and must not see it
LEAKPROOF = {
    "no qual": "SELECT t.pod, count(*) AS n FROM {d} t GROUP BY t.pod ORDER BY t.pod",
    "the secret's equality": "SELECT t.id FROM {d} t WHERE t.secret = 'target' OR t.id = 7",
    "an id range": "SELECT t.id FROM {d} t WHERE t.id > 3000 AND t.owner <> 'user-0'",
    "in, is null, not": "SELECT t.id FROM {d} t WHERE t.secret IN ('target', 's7', 's307') AND t.owner IS NOT NULL AND NOT (t.pod = 'pod-x')",
}


@pytest.mark.parametrize("statement", LEAKPROOF)
@pytest.mark.parametrize("dataset", TABLES)
async def test_a_leakproof_statement_runs_unfenced_and_answers_the_same_with_and_without_a_forbidden_row(
    gateways: tuple[httpx.AsyncClient, httpx.AsyncClient],
    world: World,
    ds: DsConnectorDouble,
    dataset: str,
    statement: str,
) -> None:
    a, b = gateways
    ds.set_policy(verdicts(8))
    sql = LEAKPROOF[statement].format(d=dataset)
    user = {"Authorization": f"Bearer {world.user_token('user-7')}"}
    edr = {"Authorization": f"Bearer {world.edr()}", "Edc-Contract-Agreement-Id": AGREEMENT}
    r = await a.post("/query/plan", json={"sql": sql}, headers=user)  # the normal path's plan
    assert r.status_code == 200, r.text
    assert "AS _dp_rf WHERE" in r.json()["sql"]
    assert "OFFSET 0" not in r.json()["sql"]
    for headers in (user, edr):
        status, items = await same_answers(a, b, "/query", sql, headers)
        assert status == 200, items
        assert items
        assert all(row.get("id") != 99999 for row in items)


async def test_exposure_answers_the_same_on_every_path_with_and_without_a_forbidden_row(
    gateways: tuple[httpx.AsyncClient, httpx.AsyncClient],
    databases: tuple[str, str],
    world: World,
    ds: DsConnectorDouble,
) -> None:
    """Issue 15 on the normal, EDR and DPS paths: every statement naming the unexposed `secret`
    is refused `column_not_exposed`, byte for byte as when it names a column no table has; the
    one naming only exposed columns (a raising predicate on `reading`) answers the same rows with
    and without the forbidden row, so a fence listing columns is a barrier too."""
    a, b = gateways
    row_filter = {
        "handler": "subject_key_match",
        "args": {"column": "pod", "key_type": "pod"},
        "keys": [f"pod:{p}" for p in ALLOWED_PODS[:8]],
        "subject_dids": ["did:web:subject.example"],
    }
    ds.set_policy(ds_policy([{"dataset_id": NARROW, "row_filter": row_filter}]))
    paths = {
        "normal": ("/query", {"Authorization": f"Bearer {world.user_token('user-7')}"}),
        "edr": ("/query", {"Authorization": f"Bearer {world.edr()}", "Edc-Contract-Agreement-Id": AGREEMENT}),
        "dps": ("/dps/public/query", {"Authorization": f"Bearer {await _pull_grant(databases[0], NARROW)}"}),
    }
    for name, (path, headers) in paths.items():
        for statement, template in STATEMENTS.items():
            sql = template.format(d=NARROW)
            if "secret" not in sql:
                status, items = await same_answers(a, b, path, sql, headers)
                assert status == 200 and items, (name, statement, items)
                continue
            bodies = set()
            for gateway in (a, b):
                for text in (sql, sql.replace("secret", "nosuch")):
                    r = await gateway.post(path, json={"sql": text}, headers=headers)
                    assert (r.status_code, r.json()["error"]) == (400, "column_not_exposed"), (
                        name,
                        statement,
                    )
                    bodies.add(r.content)
            assert len(bodies) == 1, (name, statement)
