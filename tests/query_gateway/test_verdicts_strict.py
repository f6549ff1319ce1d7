"""Issue 19: ds's verdicts read strictly where it matters (RF-01, RF-02, RF-06), and function calls
only by name — attribute notation (`rel.func`) and field selection refused on every path."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from dataplane_local.doubles.ds_connector import DsConnectorDouble
from dataplane_testing.gateway import World, authorize_answer, ds_policy, edr_query, refused
from dataplane_testing.topics import TopicTail

SKM = {"handler": "subject_key_match", "args": {"column": "pod", "key_type": "pod"}, "keys": ["pod:pod-1"]}


def answer_with(ds: DsConnectorDouble, *verdicts: dict[str, Any]) -> None:
    ds.set_fault(endpoint="authorize", status=200, body=authorize_answer(list(verdicts)))


@pytest.mark.parametrize(
    "second",
    [
        {"dataset_id": "readings", "decision": "deny", "reason": "withdrawn"},
        {"dataset_id": "readings", "decision": "allow", "row_filter": {"handler": "allow_all"}},
        {"dataset_id": "readings", "decision": "allow", "row_filter": SKM},
    ],
    ids=["allow-and-deny", "allow-and-another-allow", "the-same-allow-twice"],
)
async def test_two_verdicts_for_one_dataset_are_unreadable(
    client: httpx.AsyncClient,
    world: World,
    ds: DsConnectorDouble,
    disclosures: TopicTail,
    second: dict[str, Any],
) -> None:
    answer_with(ds, {"dataset_id": "readings", "decision": "allow", "row_filter": SKM}, second)
    r = await edr_query(client, world, "SELECT id FROM readings")
    refused(r, 502, "row_filter_unreadable")
    assert "readings" in r.json()["detail"] and "pod-1" not in r.text
    assert await disclosures.quiet() == []


async def test_rf01_a_ds_allow_all_filter_is_no_person_layer_filter_not_every_row(
    client: httpx.AsyncClient, world: World, ds: DsConnectorDouble, disclosures: TopicTail
) -> None:
    # readings' own person layer is subject_key_match: it does not admit every row
    answer_with(ds, {"dataset_id": "readings", "decision": "allow", "row_filter": {"handler": "allow_all"}})
    refused(await edr_query(client, world, "SELECT id FROM readings"), 403, "row_policy_denied")
    assert await disclosures.quiet() == []
    # stats' person layer is allow_all: the catalogue admits every row, so every row is served
    answer_with(ds, {"dataset_id": "stats", "decision": "allow", "row_filter": {"handler": "allow_all"}})
    r = await edr_query(client, world, "SELECT id FROM stats ORDER BY id")
    assert r.status_code == 200, r.text
    assert r.json()["items"] == [{"id": 1}, {"id": 2}]


@pytest.mark.parametrize("dataset", ["readings", "stats"])
async def test_rf05_a_ds_deny_all_filter_serves_no_rows_whatever_the_catalogue_says(
    client: httpx.AsyncClient, world: World, ds: DsConnectorDouble, dataset: str
) -> None:
    answer_with(ds, {"dataset_id": dataset, "decision": "allow", "row_filter": {"handler": "deny_all"}})
    r = await edr_query(client, world, f"SELECT id FROM {dataset}")
    assert r.status_code == 200, r.text
    assert r.json()["items"] == [] and r.json()["total"] == 0


async def test_a_ds_filter_naming_a_column_the_table_lacks_is_502_not_the_consumers_error(
    client: httpx.AsyncClient, world: World, ds: DsConnectorDouble, disclosures: TopicTail
) -> None:
    rf = {"handler": "subject_key_match", "args": {"column": "no_such_column", "key_type": "pod"}}
    answer_with(
        ds, {"dataset_id": "readings", "decision": "allow", "row_filter": {**rf, "keys": ["pod:pod-1"]}}
    )
    r = await edr_query(client, world, "SELECT id FROM readings")
    refused(r, 502, "row_filter_unreadable")
    assert await disclosures.quiet() == []


ATTRIBUTE_CALLS = [
    "SELECT s.to_jsonb FROM stats s",
    "SELECT s.quote_literal FROM stats s",
    "SELECT s.json_agg FROM stats s",
    "SELECT stats.to_jsonb FROM stats",
    "SELECT x.id FROM (SELECT s.id FROM stats s) x WHERE x.to_jsonb IS NOT NULL",
    "WITH c AS (SELECT id FROM stats) SELECT c.row_to_json FROM c",
    "SELECT (s).to_jsonb FROM stats s",
    "SELECT (s.label).length FROM stats s",
    "SELECT s.label.length FROM stats s",
    "SELECT id FROM stats s WHERE s.pg_stat_reset IS NULL",
]


@pytest.mark.parametrize("sql", ATTRIBUTE_CALLS)
async def test_attribute_notation_calls_are_refused_on_the_normal_path(
    client: httpx.AsyncClient, sql: str
) -> None:
    r = await client.post("/query", json={"sql": sql})
    refused(r, 400, "sql_refused")


@pytest.mark.parametrize("sql", ATTRIBUTE_CALLS[:4])
async def test_attribute_notation_calls_are_refused_on_the_edr_path(
    client: httpx.AsyncClient, world: World, ds: DsConnectorDouble, disclosures: TopicTail, sql: str
) -> None:
    ds.set_policy(ds_policy(["stats"]))
    refused(await edr_query(client, world, sql), 400, "sql_refused")
    assert await disclosures.quiet() == []


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT s.id, s.label FROM stats s ORDER BY s.id",
        "SELECT x.n FROM (SELECT count(*) AS n FROM stats s) x",
        "WITH c(k) AS (SELECT id FROM stats) SELECT c.k FROM c ORDER BY c.k",
        "SELECT x.label FROM (SELECT * FROM stats) x ORDER BY x.label",
    ],
)
async def test_qualified_references_to_real_columns_are_served(client: httpx.AsyncClient, sql: str) -> None:
    r = await client.post("/query", json={"sql": sql})
    assert r.status_code == 200, r.text
    assert r.json()["items"]
