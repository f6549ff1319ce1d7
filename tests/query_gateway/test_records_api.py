"""The records API (docs/records.md) against real signaling, PostgreSQL, broker and the ds
double: freezing at the start, the catalogue changed after it, consent withdrawn at ds, exact
numbers, cursors, and the no-oracle answer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from gateway_support import TopicTail, World
from records_support import PROFILE, RecordsWorld, consent_policy, declaration, keys_of, records_world

from dataplane_local.doubles.ds_connector import DsConnectorDouble


@pytest.fixture(scope="module")
async def rw(
    world: World, postgres_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[RecordsWorld]:
    async with records_world(world, postgres_url, tmp_path_factory.mktemp("records")) as running:
        yield running


@pytest.fixture
def consented(ds: DsConnectorDouble) -> DsConnectorDouble:
    ds.set_policy(consent_policy(["s1", "s2"]))
    return ds


async def test_records_a_started_flow_pages_its_records_in_key_order(
    rw: RecordsWorld, consented: DsConnectorDouble, disclosures: TopicTail
) -> None:
    _, token = await rw.start()
    r = await rw.records(token)
    assert keys_of(r) == [1, 2, 3, 4, 5, 6, 7]
    assert r.json()["has_more"] is False and r.json()["next_cursor"] is None
    assert "hidden_score" not in r.json()["items"][0]
    [call] = consented.calls("authorize")
    assert call.body["dataset_ids"] == ["transactions"]
    [event] = await disclosures.read(1)
