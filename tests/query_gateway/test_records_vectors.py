"""The client range-filter vectors (tests/query_gateway/vectors/client-range-filters.json) run
against the real gateway: each vector's flow started through signaling, its request sent, its
outcome compared exactly (status and code, or the exact record keys)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dataplane_local.doubles.ds_connector import DsConnectorDouble
from dataplane_testing.records import RecordsWorld, consent_policy, declaration

VECTORS = json.loads(Path(__file__).with_name("vectors").joinpath("client-range-filters.json").read_text())
PULL_SQL = {"sql": "SELECT id FROM transactions ORDER BY id"}


def test_every_resource_server_requirement_is_named_by_a_vector() -> None:
    named = {r for v in VECTORS["vectors"] for r in v["covers"]}
    assert named == set(VECTORS["requirements"]) - {"RS-09"}  # RS-09: cursors, tested beside
    assert not named & set(VECTORS["not_applicable"])
    assert len({v["id"] for v in VECTORS["vectors"]}) == len(VECTORS["vectors"])


async def _send(rw: RecordsWorld, token: str, request: dict[str, Any]) -> Any:
    headers = {"Authorization": f"Bearer {token}"}
    query = request.get("query", "")
    suffix = f"?{query}" if query else ""
    endpoint = request["endpoint"]
    if endpoint == "records":
        return await rw.gateway.get(f"/dps/public/streams/transactions/records{suffix}", headers=headers)
    if endpoint == "stream":
        return await rw.gateway.get(f"/dps/public/streams/transactions{suffix}", headers=headers)
    if endpoint == "query":
        return await rw.gateway.post(f"/dps/public/query{suffix}", json=PULL_SQL, headers=headers)
    assert endpoint == "protected_resource"
    return await rw.gateway.get("/.well-known/oauth-protected-resource")


@pytest.mark.parametrize("vector", VECTORS["vectors"], ids=[v["id"] for v in VECTORS["vectors"]])
async def test_client_range_filter_vector(
    rw: RecordsWorld, ds: DsConnectorDouble, vector: dict[str, Any]
) -> None:
    fixture = vector["fixture"]
    declared = fixture.get("declaration")
    rw.declare(declaration(drop=True) if declared == "no-records" else declaration(declared))
    ds.set_policy(consent_policy(fixture.get("consented", ["s1", "s2"])))
    flow, token = await rw.start(fixture.get("filters", True))
    if "grant_extensions" in fixture:
        await rw.set_extensions(flow, fixture["grant_extensions"])
    r = await _send(rw, token, vector["request"])
    expect = vector["expect"]
    assert r.status_code == expect["status"], r.text
    body = r.json()
    if "error" in expect:
        assert body["error"] == expect["error"], body
    if "keys" in expect:
        assert [item["id"] for item in body["items"]] == expect["keys"]
    if "has_more" in expect:
        assert body["has_more"] is expect["has_more"]
    if "body" in expect:
        assert body == expect["body"]
    if "capabilities" in expect:
        assert body["capabilities"] == expect["capabilities"]
