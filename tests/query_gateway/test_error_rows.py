"""Error-table rows of the gateway not proven elsewhere, over HTTP: a malformed request body, a
statement the database refuses, unknown and ambiguous datasets. Each leaves no rows and changes
nothing."""

from __future__ import annotations

import httpx


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
