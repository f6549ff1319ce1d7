"""QE-12 and QE-01 over HTTP (issue 34): the statements PostgreSQL's grammar reads otherwise than
sqlglot are refused on the normal and EDR paths with a fixed reason, and the body's fields are
strictly typed."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from dataplane_local.doubles.ds_connector import DsConnectorDouble
from dataplane_testing.gateway import World, ds_policy, edr_query, extended_catalogue, running_gateway
from query_gateway.sql.pg_verify import DISAGREEMENT

DOTTED = """
  - id: rtschema.rt_other    # a dotted id: `rtschema.rt_other` names it, `"rtschema.rt_other"` does not
    table: public.stats
    access_level: open
    expose: true
    row_filters:
      person: {handler: allow_all, binds: person}
      organization: {handler: allow_all, binds: organization}
"""


@pytest.fixture(scope="module")
async def dotted_client(
    world: World, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[httpx.AsyncClient]:
    path = extended_catalogue(tmp_path_factory.mktemp("catalogue"), DOTTED, "dotted")
    async with running_gateway(world.settings(catalogue_path=path)) as c:
        yield c


def refused_fixed(r: httpx.Response) -> None:
    assert r.status_code == 400, r.text
    body = r.json()
    assert (body["error"], body["detail"]) == ("sql_refused", DISAGREEMENT)


async def test_qe12_a_quoted_identifier_holding_a_dot_is_not_served_as_a_dataset(
    dotted_client: httpx.AsyncClient,
) -> None:
    ok = await dotted_client.post("/query", json={"sql": "SELECT id FROM rtschema.rt_other ORDER BY id"})
    assert ok.status_code == 200, ok.text
    assert [i["id"] for i in ok.json()["items"]] == [1, 2]
    refused_fixed(await dotted_client.post("/query", json={"sql": 'SELECT * FROM "rtschema.rt_other"'}))
    refused_fixed(await dotted_client.post("/query/plan", json={"sql": 'SELECT * FROM "rtschema.rt_other"'}))


async def test_qe12_system_user_is_refused_on_both_paths(
    client: httpx.AsyncClient, world: World, ds: DsConnectorDouble
) -> None:
    refused_fixed(await client.post("/query", json={"sql": "SELECT system_user FROM stats"}))
    ds.set_policy(ds_policy(["stats"]))
    refused_fixed(await edr_query(client, world, "SELECT system_user AS u FROM stats"))
    assert ds.calls("authorize") == []  # refused before ds is asked


async def test_qe12_a_refusal_of_only_with_parentheses_carries_no_parser_internals(
    client: httpx.AsyncClient,
) -> None:
    r = await client.post("/query", json={"sql": "SELECT * FROM ONLY (stats)"})
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["error"] == "sql_refused"
    assert body["detail"] == "Invalid SQL syntax at line 1, column 20"


@pytest.mark.parametrize(
    ("field", "value"),
    [("limit", True), ("limit", "5"), ("limit", 5.0), ("offset", False), ("offset", "1"), ("skip_count", 1),
     ("skip_count", "true"), ("sql", 5)],
)  # fmt: skip
async def test_issue34_the_body_is_strictly_typed(
    client: httpx.AsyncClient, field: str, value: object
) -> None:
    body: dict[str, object] = {"sql": "SELECT id FROM stats ORDER BY id", field: value}
    r = await client.post("/query", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["error"] == "invalid_request"
    assert field in r.json()["detail"]


async def test_issue34_well_typed_paging_is_served(client: httpx.AsyncClient) -> None:
    body = {"sql": "SELECT id FROM stats ORDER BY id", "limit": 1, "skip_count": True}
    r = await client.post("/query", json=body)
    assert r.status_code == 200, r.text
    assert (r.json()["limit"], r.json()["items"]) == (1, [{"id": 1}])
