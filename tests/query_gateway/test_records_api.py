"""The records API (docs/records.md) against real signaling, PostgreSQL, broker and the ds
double: what the vectors cannot say in one request — the declaration changed after a flow
started, consent withdrawn at ds, cursors, the no-oracle answer byte for byte, the disclosure —
and the start-up refusals."""

from __future__ import annotations

import json
from pathlib import Path

import asyncpg
import httpx
import pytest
import yaml

from dataplane_local.doubles.ds_connector import DsConnectorDouble
from dataplane_testing import signaling as signaling_support
from dataplane_testing.gateway import AGREEMENT, CONSUMER, World, running_gateway
from dataplane_testing.records import (
    CATALOGUE,
    CURSOR_SECRET,
    RecordsWorld,
    consent_policy,
    declaration,
    keys_of,
)
from dataplane_testing.topics import TopicTail
from query_gateway.app import StartupRefused

AMOUNT_GTE_LTE = {"amount": {"type": "number", "ops": ["gte", "lte"]}}


@pytest.fixture
def consented(rw: RecordsWorld, ds: DsConnectorDouble) -> DsConnectorDouble:
    rw.declare(declaration())
    ds.set_policy(consent_policy(["s1", "s2"]))
    return ds


def refused(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.json()["error"] == code


async def test_records_a_page_is_a_disclosure_recorded_before_it_leaves(
    rw: RecordsWorld, consented: DsConnectorDouble, disclosures: TopicTail
) -> None:
    _, token = await rw.start()
    r = await rw.records(token, [("filter[amount][gte]", "0.3")])
    assert keys_of(r) == [1, 2, 7]
    assert "hidden_score" not in r.json()["items"][0]  # the catalogue's exposure holds
    [call] = consented.calls("authorize")
    assert call.body["dataset_ids"] == ["transactions"] and call.body["agreement_id"] == AGREEMENT
    [record] = await disclosures.read(1)
    event = json.loads(record.value)
    assert event["dataset_id"] == "transactions" and event["consumer_id"] == CONSUMER
    assert event["row_count"] == 3
    assert sorted(event["authorized_subject_ids"]) == ["did:web:s1.example", "did:web:s2.example"]


async def test_records_a_declaration_changed_after_the_start_changes_nothing_for_that_flow(
    rw: RecordsWorld, consented: DsConnectorDouble
) -> None:
    rw.declare(declaration(AMOUNT_GTE_LTE))
    _, before = await rw.start()
    # an operator removed, a field added: only flows started from now on see it
    rw.declare(
        declaration(
            {"amount": {"type": "number", "ops": ["gte"]}, "qty": {"type": "integer", "ops": ["lte"]}}
        )
    )
    _, after = await rw.start()

    assert keys_of(await rw.records(before, [("filter[amount][lte]", "0.1")])) == [3, 6]
    refused(await rw.records(before, [("filter[qty][lte]", "10")]), 400, "invalid_request")
    refused(await rw.records(after, [("filter[amount][lte]", "0.1")]), 400, "invalid_request")
    assert keys_of(await rw.records(after, [("filter[qty][lte]", "5")])) == [5, 6]
    old, new = (await rw.metadata(before)).json(), (await rw.metadata(after)).json()
    assert old["query"] == {
        "range_filters": {"amount": ["gte", "lte"]},
        "range_filter_types": {"amount": "number"},
    }
    assert new["query"] == {
        "range_filters": {"amount": ["gte"], "qty": ["lte"]},
        "range_filter_types": {"amount": "number", "qty": "integer"},
    }


async def test_records_resume_keeps_the_flows_frozen_set(
    rw: RecordsWorld, consented: DsConnectorDouble
) -> None:
    rw.declare(declaration(AMOUNT_GTE_LTE))
    flow, _ = await rw.start()
    rw.declare(declaration())
    assert await rw.signal(flow, "suspend", {"reason": "pause"}) is None
    resumed = await rw.signal(flow, "resume")
    assert resumed is not None
    meta = (await rw.metadata(resumed)).json()
    assert meta["query"]["range_filters"] == {"amount": ["gte", "lte"]}
    refused(await rw.records(resumed, [("filter[qty][lte]", "10")]), 400, "invalid_request")


async def test_records_consent_withdrawn_at_ds_shrinks_the_next_answer(
    rw: RecordsWorld, consented: DsConnectorDouble
) -> None:
    _, token = await rw.start()
    query = [("filter[amount][gte]", "0")]
    assert keys_of(await rw.records(token, query)) == [1, 2, 3, 5, 7]
    consented.set_policy(consent_policy(["s1"]))  # s2 withdrew: the verdict's keys shrink
    assert keys_of(await rw.records(token, query)) == [1, 2, 3, 7]
    consented.set_policy(consent_policy([]))
    assert keys_of(await rw.records(token, query)) == []
    assert len(consented.calls("authorize")) == 3  # no decision cached: ds asked every time


async def test_records_a_field_outside_the_frozen_set_gets_one_answer_byte_for_byte(
    rw: RecordsWorld, consented: DsConnectorDouble
) -> None:
    rw.declare(declaration(AMOUNT_GTE_LTE))
    _, token = await rw.start()
    # posted_on: declared by the gateway's catalogue today, not frozen for this flow;
    # hidden_score: a column the dataset does not expose; memo: exposed, never declared;
    # nothing_here: no column at all; qty with an operator nobody declared
    answers = [
        await rw.records(token, [(f"filter[{field}][{op}]", "1")])
        for field, op in (
            ("posted_on", "gte"),
            ("hidden_score", "gte"),
            ("memo", "gte"),
            ("nothing_here", "gte"),
            ("amount", "gt"),
        )
    ]
    assert {(r.status_code, r.content) for r in answers} == {(400, answers[0].content)}
    assert answers[0].json()["error"] == "invalid_request"


async def test_records_cursors_page_the_filtered_result_and_bind_its_filter_set(
    rw: RecordsWorld, consented: DsConnectorDouble
) -> None:
    flow, token = await rw.start()
    query = [("filter[amount][gte]", "0"), ("filter[posted_on][lte]", "2024-12-31"), ("limit", "2")]
    pages: list[list[int]] = []
    cursor = None
    while True:
        r = await rw.records(token, query + ([("cursor", cursor)] if cursor else []))
        pages.append(keys_of(r))
        cursor = r.json()["next_cursor"]
        assert r.json()["has_more"] is (cursor is not None)
        if cursor is None:
            break
        # the same set in another order and spelling continues; another set does not
        respelled = [
            ("filter[posted_on][lte]", "2024-12-31"),
            ("filter[amount][gte]", "0.000"),
            ("limit", "2"),
        ]
        assert (await rw.records(token, [*respelled, ("cursor", cursor)])).status_code == 200
    assert pages == [[1, 2], [3, 5], [7]]

    r = await rw.records(token, query)
    first = r.json()["next_cursor"]
    for other in (
        [("filter[amount][gte]", "1"), ("filter[posted_on][lte]", "2024-12-31")],
        [("filter[amount][gte]", "0")],
        [],
    ):
        refused(await rw.records(token, [*other, ("cursor", first)]), 400, "invalid_cursor")
    tampered = first[:-2] + ("A" if first[-2] != "A" else "B") + first[-1]
    refused(await rw.records(token, [*query, ("cursor", tampered)]), 400, "invalid_cursor")
    refused(await rw.records(token, [*query, ("cursor", "not-a-cursor")]), 400, "invalid_cursor")
    _, other_flow = await rw.start()
    refused(await rw.records(other_flow, [*query, ("cursor", first)]), 400, "invalid_cursor")
    assert flow  # the cursor names its flow: another flow's token cannot continue it


async def test_records_the_flows_dataset_only(rw: RecordsWorld, consented: DsConnectorDouble) -> None:
    _, token = await rw.start()
    for dataset in ("ledger", "no_such_dataset"):
        refused(await rw.records(token, dataset=dataset), 403, "not_offered")
    _, ledger = await rw.start(dataset="ledger")
    consented.set_policy(consent_policy(["s1"], dataset="ledger"))
    refused(await rw.records(ledger, dataset="ledger"), 403, "not_offered")  # no records: declared
    refused(await rw.records("junk"), 401, "pull_token")


async def test_records_a_start_asking_with_anything_but_a_boolean_is_invalid_message(
    rw: RecordsWorld,
) -> None:
    for value in ("true", 1, None, {"x": True}):
        msg = signaling_support.start_message(
            f"flow-bad-{id(value)}", datasetId="transactions", metadata={"pdpp_range_filters": value}
        )
        r = await rw.signaling.post(
            f"{signaling_support.FLOWS}/start", json=msg, headers=signaling_support.auth(rw.cp_token)
        )
        assert r.status_code == 422 and r.json()["error"] == "invalid_message", r.text


def _catalogue(tmp_path: Path, **records: object) -> str:
    catalogue = yaml.safe_load(CATALOGUE.read_text())
    catalogue["datasets"][0]["records"].update(records)
    path = tmp_path / "catalogue.yaml"
    path.write_text(yaml.safe_dump(catalogue))
    return str(path)


@pytest.mark.parametrize(
    ("records", "named"),
    [
        (
            {"range_filters": {"amount": {"type": "date", "ops": ["gte"]}}},
            "records.range_filters field amount",
        ),
        (
            {"range_filters": {"posted_at": {"type": "date", "ops": ["gte"]}}},
            "records.range_filters field posted_at",
        ),
        (
            {"range_filters": {"qty": {"type": "date-time", "ops": ["gte"]}}},
            "records.range_filters field qty",
        ),
        ({"key": ["subject"]}, "records.key subject is not unique"),
        ({"key": ["amount"]}, "records.key field amount may be NULL"),
    ],
)
async def test_gs09_records_a_declaration_the_table_contradicts_refuses_start_up(
    world: World, rw: RecordsWorld, tmp_path: Path, records: dict[str, object], named: str
) -> None:
    settings = world.settings(
        catalogue_path=_catalogue(tmp_path, **records),
        datasets_database_url=_datasets_url(rw),
        records_cursor_secret=CURSOR_SECRET,
    )
    with pytest.raises(StartupRefused, match="dataset transactions: " + named):
        async with running_gateway(settings):
            pass


async def test_records_a_dps_gateway_declaring_records_needs_a_cursor_secret(
    world: World, rw: RecordsWorld
) -> None:
    settings = world.settings(
        catalogue_path=str(CATALOGUE),
        datasets_database_url=_datasets_url(rw),
        dps_enabled=True,
        dps_token_public_key=rw.public_pem,
        dps_flows_database_url=rw.flows_url,
    )
    with pytest.raises(StartupRefused, match="RECORDS_CURSOR_SECRET is required: dataset transactions"):
        async with running_gateway(settings):
            pass


def _datasets_url(rw: RecordsWorld) -> str:
    return rw.datasets_url


async def test_records_rows_outside_the_grant_change_nothing_in_the_answer(
    rw: RecordsWorld, ds: DsConnectorDouble
) -> None:
    """Pages, has_more and the cursor come from the permitted, filtered rows: a record of a
    subject who gave no consent, inside the filter's range and after the last permitted key,
    leaves every byte of both pages as it was (the last page still says no more)."""
    rw.declare(declaration())
    ds.set_policy(consent_policy(["s1"]))
    _, token = await rw.start()
    query = [("filter[amount][gte]", "0"), ("limit", "2")]

    async def both_pages() -> tuple[httpx.Response, httpx.Response]:
        first = await rw.records(token, query)
        return first, await rw.records(token, [*query, ("cursor", first.json()["next_cursor"])])

    before = await both_pages()
    conn = await asyncpg.connect(rw.datasets_url)
    try:
        await conn.execute("INSERT INTO transactions (id, subject, amount) VALUES (150, 's2', 0.25)")
        after = await both_pages()
    finally:
        await conn.execute("DELETE FROM transactions WHERE id = 150")
        await conn.close()
    assert [keys_of(r) for r in after] == [[1, 2], [3, 7]]
    assert after[1].json()["has_more"] is False
    assert [r.content for r in before] == [r.content for r in after]
