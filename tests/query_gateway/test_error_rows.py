"""Error-table rows of the gateway not proven elsewhere, over HTTP: a malformed request body, a
statement the database refuses, unknown and ambiguous datasets, a filter without `column`, and a
per-dataset deny inside an allowing ds answer. Each leaves no rows and changes nothing."""

from __future__ import annotations

import uuid

import httpx

from dataplane_local.doubles.ds_connector import ROOT, DsConnectorDouble
from dataplane_testing.gateway import AGREEMENT, World, ds_policy
from dataplane_testing.topics import TopicTail


def refused(response: httpx.Response, status: int, code: str) -> dict[str, str]:
    assert response.status_code == status, response.text
    body: dict[str, str] = response.json()
    assert body["error"] == code and isinstance(body["detail"], str) and "items" not in body
    return body


async def test_malformed_body_is_422_invalid_request_naming_the_field(client: httpx.AsyncClient) -> None:
    body = refused(
        await client.post("/query", json={"sql": "SELECT id FROM stats", "limit": "many"}),
        422,
        "invalid_request",
    )
    assert "limit" in body["detail"] and "many" not in body["detail"]


async def test_database_error_in_the_statement_is_400_query_failed(client: httpx.AsyncClient) -> None:
    r = await client.post("/query", json={"sql": "SELECT id / (id - id) AS boom FROM stats"})
    refused(r, 400, "query_failed")


async def test_unknown_dataset_is_400(client: httpx.AsyncClient) -> None:
    refused(
        await client.post("/query", json={"sql": "SELECT * FROM no_such_dataset"}), 400, "unknown_dataset"
    )


async def test_sql_refused_for_a_write_and_for_stacking(client: httpx.AsyncClient) -> None:
    refused(await client.post("/query", json={"sql": "DELETE FROM stats"}), 400, "sql_refused")
    refused(await client.post("/query", json={"sql": "SELECT 1 FROM stats; SELECT 2"}), 400, "sql_refused")
    # the public dataset still holds its rows: nothing was changed
    r = await client.post("/query", json={"sql": "SELECT count(*) AS n FROM stats"})
    assert r.status_code == 200 and r.json()["items"] == [{"n": 2}]


TRANSFER = f"tp-{uuid.uuid4().hex[:12]}"  # names this module's disclosures among the session's


async def edr_query(client: httpx.AsyncClient, world: World, sql: str) -> httpx.Response:
    headers = {
        "Authorization": f"Bearer {world.edr()}",
        "Edc-Contract-Agreement-Id": AGREEMENT,
        "Edc-Transfer-Process-Id": TRANSFER,
    }
    return await client.post("/query", json={"sql": sql}, headers=headers)


async def none_disclosed(disclosures: TopicTail) -> bool:
    return not [r for r in await disclosures.quiet() if TRANSFER in r.value.decode()]


async def test_an_ambiguous_dataset_reference_is_400_ambiguous_dataset(
    extended_client: httpx.AsyncClient,
) -> None:
    # `energy.stats` ends both `north.energy.stats` and `south.energy.stats`
    body = refused(
        await extended_client.post("/query", json={"sql": "SELECT id FROM energy.stats"}),
        400,
        "ambiguous_dataset",
    )
    assert "energy.stats" in body["detail"]
    # the full id is not ambiguous: the same table is served
    r = await extended_client.post("/query", json={"sql": "SELECT id FROM north.energy.stats ORDER BY id"})
    assert r.status_code == 200, r.text
    assert r.json()["items"] == [{"id": 1}, {"id": 2}]


async def test_rf04_a_filter_without_column_is_500_row_filter_invalid(
    extended_client: httpx.AsyncClient, world: World
) -> None:
    r = await extended_client.post(
        "/query",
        json={"sql": "SELECT id FROM no_column"},
        headers={"Authorization": f"Bearer {world.user_token()}"},
    )
    body = refused(r, 500, "row_filter_invalid")
    assert body["detail"] == "row filter subject_key_match for no_column names no column"


async def test_rf04_a_ds_filter_without_column_is_500_row_filter_invalid_and_discloses_nothing(
    client: httpx.AsyncClient, world: World, ds: DsConnectorDouble, disclosures: TopicTail
) -> None:
    rf = {"handler": "subject_key_match", "args": {"key_type": "pod"}, "keys": ["pod:pod-1"]}
    ds.set_policy(ds_policy([{"dataset_id": "readings", "row_filter": rf}]))
    body = refused(await edr_query(client, world, "SELECT id FROM readings"), 500, "row_filter_invalid")
    assert "pod-1" not in body["detail"]
    assert await none_disclosed(disclosures)


async def test_a_per_dataset_deny_inside_an_allow_answer_is_403_ds_refused_with_no_rows(
    client: httpx.AsyncClient, world: World, ds: DsConnectorDouble, disclosures: TopicTail
) -> None:
    policy = ds_policy(
        [{"dataset_id": "stats"}, {"dataset_id": "assets", "decision": "deny", "reason": "nope"}]
    )
    policy["agreements"][AGREEMENT]["partial_allow"] = True
    ds.set_policy(policy)
    for sql in ("SELECT id FROM assets", "SELECT s.id FROM stats s JOIN assets a ON a.id = s.id"):
        ds.clear_calls()
        body = refused(await edr_query(client, world, sql), 403, "ds_refused")
        assert "assets" in body["detail"]
        # the answer the gateway refused: the envelope allows, the dataset's own verdict denies
        [call] = ds.calls("authorize")
        answer = ds.decide(ROOT, call.body)
        assert answer["decision"] == "allow"
        assert {v["dataset_id"]: v["decision"] for v in answer["datasets"]}["assets"] == "deny"
    assert await none_disclosed(disclosures)
    # the allowed dataset alone is still served under the same answer shape
    r = await edr_query(client, world, "SELECT id FROM stats ORDER BY id")
    assert r.status_code == 200, r.text
    assert r.json()["items"] == [{"id": 1}, {"id": 2}]
