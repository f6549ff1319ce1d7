"""Rewrite safety: the forged-key aggregate reads only permitted rows wherever the table appears."""

from __future__ import annotations

import pytest

from dataplane_contracts.catalogue import Catalogue
from dataplane_contracts.plans import Plan
from dataplane_testing.sqlgw import CATALOGUE, READINGS, Db, allow_all, pods
from query_gateway.sql import load_column_types, narrow_query, validate_query

POD1_SUM = sum(v for _, p, v, _ in READINGS if p == "pod-1")
ALL_SUM = sum(v for _, _, v, _ in READINGS)

FORGED = {
    "main query": "SELECT 'pod-1' AS pod, sum(value) AS total FROM readings",
    "cte": "WITH x AS (SELECT * FROM readings) SELECT 'pod-1' AS pod, sum(value) AS total FROM x",
    "cte shadowing the dataset": (
        "WITH readings AS (SELECT * FROM readings) SELECT 'pod-1' AS pod, sum(value) AS total FROM readings"
    ),
    "subquery in from": "SELECT 'pod-1' AS pod, sum(value) AS total FROM (SELECT value FROM readings) s",
    "scalar subquery": "SELECT 'pod-1' AS pod, (SELECT sum(value) FROM readings) AS total FROM grid.meters "
    "WHERE pod = 'pod-1'",
    "subquery in where": "SELECT 'pod-1' AS pod, sum(value) AS total FROM readings "
    "WHERE value IN (SELECT value FROM readings)",
    "left side of a join": "SELECT 'pod-1' AS pod, sum(r.value) AS total FROM readings r "
    "JOIN (SELECT DISTINCT 1 AS one FROM grid.meters) m ON TRUE",
    "right side of a join": "SELECT 'pod-1' AS pod, sum(r.value) AS total "
    "FROM (SELECT DISTINCT 1 AS one FROM grid.meters) m LEFT JOIN readings r ON TRUE",
    "lateral": "SELECT 'pod-1' AS pod, sum(l.value) AS total FROM grid.meters m, "
    "LATERAL (SELECT value FROM readings WHERE readings.pod = m.pod) l",
}


@pytest.mark.parametrize("where", FORGED)
async def test_forged_pod_aggregate_reads_only_permitted_rows(db: Db, where: str) -> None:
    page = await db.query(FORGED[where], pods("pod-1"))
    assert [(i["pod"], i["total"]) for i in page.items] == [("pod-1", POD1_SUM)]
    unfiltered = await db.query(FORGED[where], allow_all())
    assert unfiltered.items[0]["total"] == ALL_SUM  # the statement itself does read every row


def _readings_catalogue(table: str) -> Catalogue:
    entry = CATALOGUE.by_id()["readings"].model_dump()
    return Catalogue.model_validate({"datasets": [{**entry, "table": table}]})


@pytest.mark.parametrize("table", ["public.readings", "readings", "PUBLIC.READINGS", '"public"."readings"'])
@pytest.mark.parametrize("written", ["readings", "READINGS", '"readings"'])
async def test_physical_table_in_any_case_or_quoting_is_narrowed(db: Db, table: str, written: str) -> None:
    catalogue = _readings_catalogue(table)
    columns = await load_column_types(db.pool, catalogue)
    sql = f"SELECT 'pod-1' AS pod, sum(value) AS total FROM {written}"
    narrowed = narrow_query(
        validate_query(sql, catalogue), catalogue, {"readings": pods("pod-1")["readings"]}, columns
    )
    page = await db.executor.run(narrowed, offset=0, limit=10, skip_count=False)
    assert page.items == [{"pod": "pod-1", "total": POD1_SUM}]
    assert "AS _dp_rf WHERE" in narrowed.sql and narrowed.params == (["pod-1"],)


async def test_both_layers_are_anded(db: Db) -> None:
    plans = {
        "readings": [Plan.among("pod", ["pod-1", "pod-2"]), Plan.among("org", ["org-a"])],
        "grid.meters": [],
        "ops.sites": [],
    }
    page = await db.query("SELECT id FROM readings", plans)
    expected = sorted(i for i, p, _, o in READINGS if p in ("pod-1", "pod-2") and o == "org-a")
    assert sorted(i["id"] for i in page.items) == expected
    assert page.total == len(expected)


async def test_allow_list_is_bound_never_literal(db: Db) -> None:
    narrowed = db.narrow("SELECT * FROM readings", pods("pod-1", "pod-2"))
    assert "pod-1" not in narrowed.sql
    assert narrowed.params == (["pod-1", "pod-2"],)
    assert narrowed.param_labels == ("pod keys (2 values)",)
    assert "ANY(CAST($1 AS TEXT[]))" in narrowed.sql
