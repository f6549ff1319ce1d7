"""The legacy EDR path (docs/gateway.md; RF-01, RF-02, RF-04, RF-06, RF-10; GS-13) against the ds
connector double, with the disclosure read back from the broker."""

from __future__ import annotations

import json
import logging

import httpx
import pytest

from dataplane_local.doubles.ds_connector import DsConnectorDouble
from dataplane_testing.gateway import (
    AGREEMENT,
    CONSUMER,
    PROVIDER,
    FakeResolver,
    World,
    authorize_answer,
    ds_policy,
    edr_query,
    refused,
)
from dataplane_testing.topics import TopicTail

KEYS_CONSENT = {
    "meter": [
        {"subject_did": "did:web:alice.example", "keys": ["pod:pod-1"], "principals": ["alice"]},
        {"subject_did": "did:web:bob.example", "keys": ["pod:pod-3", "other:pod-2"], "principals": ["bob"]},
    ]
}
SKM = {"handler": "subject_key_match", "args": {"column": "pod", "key_type": "pod"}}


async def test_rf04_the_verdicts_keys_narrow_the_rows_and_the_disclosure_names_dids(
    client: httpx.AsyncClient, world: World, ds: DsConnectorDouble, disclosures: TopicTail
) -> None:
    ds.set_policy(
        ds_policy([{"dataset_id": "readings", "row_filter": dict(SKM), "consent": "meter"}], KEYS_CONSENT)
    )
    r = await edr_query(client, world, "SELECT id, pod FROM readings ORDER BY id")
    assert r.status_code == 200, r.text
    assert r.json()["items"] == [{"id": 1, "pod": "pod-1"}, {"id": 3, "pod": "pod-3"}]
    [call] = ds.calls("authorize")
    assert call.body == {
        "consumer_did": CONSUMER,
        "agreement_id": AGREEMENT,
        "transfer_id": "tp-1",
        "purpose": ["analytics", "billing"],
        "dataset_ids": ["readings"],
    }
    assert call.headers["authorization"].startswith("Bearer ")  # the service's own token
    [record] = await disclosures.read(1)
    assert record.key == PROVIDER.encode()
    event = json.loads(record.value)
    assert event["dataset_id"] == "readings"
    assert event["consumer_id"] == CONSUMER
    assert event["provider_participant"] == PROVIDER
    assert event["agreement_id"] == AGREEMENT
    assert event["transfer_id"] == "tp-1"
    assert event["row_count"] == 2
    assert event["authorized_subject_ids"] == ["did:web:alice.example", "did:web:bob.example"]
    for secret in ("pod-1", "pod-3", 'alice"', 'bob"'):
        assert secret not in record.value.decode()


async def test_rf05_a_verdict_with_no_keys_of_the_type_serves_no_rows(
    client: httpx.AsyncClient, world: World, ds: DsConnectorDouble
) -> None:
    rf = {**SKM, "keys": ["other:pod-1"], "principals": ["alice"]}
    ds.set_policy(ds_policy([{"dataset_id": "readings", "row_filter": rf}]))
    r = await edr_query(client, world, "SELECT count(*) AS n FROM readings")
    assert r.status_code == 200, r.text
    # a deny puts FALSE into every SELECT, the outer page too: nothing is read (RF-05)
    assert r.json()["items"] == []
    assert r.json()["total"] == 0


async def test_rf10_no_row_filter_reports_null_subjects(
    client: httpx.AsyncClient, world: World, ds: DsConnectorDouble, disclosures: TopicTail
) -> None:
    ds.set_policy(ds_policy([{"dataset_id": "stats", "row_filter": None}]))
    r = await edr_query(client, world, "SELECT id FROM stats ORDER BY id")
    assert [row["id"] for row in r.json()["items"]] == [1, 2]
    [record] = await disclosures.read(1)
    assert json.loads(record.value)["authorized_subject_ids"] is None


async def test_not_offered_is_refused_before_ds_is_asked(
    client: httpx.AsyncClient, world: World, ds: DsConnectorDouble
) -> None:
    r = await edr_query(client, world, "SELECT s.id FROM stats s JOIN unoffered u ON s.id = u.id")
    refused(r, 403, "not_offered")
    assert r.json()["detail"] == "Dataset not offered in the dataspace: unoffered"
    assert ds.calls("authorize") == []


async def test_a_ds_deny_is_403_ds_refused(
    client: httpx.AsyncClient, world: World, ds: DsConnectorDouble
) -> None:
    ds.set_policy(ds_policy([{"dataset_id": "stats", "decision": "deny", "reason": "consent_missing"}]))
    refused(await edr_query(client, world, "SELECT id FROM stats"), 403, "ds_refused")


async def test_a_touched_dataset_the_answer_does_not_name_is_403_ds_refused(
    client: httpx.AsyncClient, world: World, ds: DsConnectorDouble
) -> None:
    ds.set_fault(
        endpoint="authorize",
        status=200,
        body=authorize_answer([{"dataset_id": "other", "decision": "allow"}]),
    )
    refused(await edr_query(client, world, "SELECT id FROM stats"), 403, "ds_refused")


async def test_ds_unreachable_or_erroring_is_502_ds_unavailable(
    client: httpx.AsyncClient, world: World, ds: DsConnectorDouble
) -> None:
    ds.set_fault(endpoint="authorize", status=500)
    refused(await edr_query(client, world, "SELECT id FROM stats"), 502, "ds_unavailable")


async def test_rf02_an_unknown_filter_field_is_502_without_echoing_keys(
    client: httpx.AsyncClient, world: World, ds: DsConnectorDouble
) -> None:
    rf = {**SKM, "keys": ["pod:secret-pod"], "novel": True}
    ds.set_fault(
        endpoint="authorize",
        status=200,
        body=authorize_answer([{"dataset_id": "readings", "decision": "allow", "row_filter": rf}]),
    )
    r = await edr_query(client, world, "SELECT id FROM readings")
    refused(r, 502, "row_filter_unreadable")
    assert "secret-pod" not in r.text and "readings" in r.json()["detail"]


async def test_rf02_a_non_did_subject_is_502(
    client: httpx.AsyncClient, world: World, ds: DsConnectorDouble
) -> None:
    rf = {**SKM, "keys": ["pod:pod-1"], "subject_dids": ["alice@mail.example"]}
    ds.set_fault(
        endpoint="authorize",
        status=200,
        body=authorize_answer([{"dataset_id": "readings", "decision": "allow", "row_filter": rf}]),
    )
    r = await edr_query(client, world, "SELECT id FROM readings")
    refused(r, 502, "row_filter_unreadable")
    assert "alice" not in r.text


async def test_rf02_an_untouched_datasets_filter_is_not_parsed(
    client: httpx.AsyncClient, world: World, ds: DsConnectorDouble
) -> None:
    answer = authorize_answer(
        [
            {"dataset_id": "stats", "decision": "allow"},
            {"dataset_id": "readings", "decision": "allow", "row_filter": {"handler": "x", "novel": 1}},
        ]
    )
    ds.set_fault(endpoint="authorize", status=200, body=answer)
    r = await edr_query(client, world, "SELECT id FROM stats ORDER BY id")
    assert r.status_code == 200, r.text
    assert r.json()["items"] == [{"id": 1}, {"id": 2}]


async def test_rf06_an_unknown_handler_is_403_row_filter_unenforceable(
    client: httpx.AsyncClient, world: World, ds: DsConnectorDouble, disclosures: TopicTail
) -> None:
    ds.set_policy(
        ds_policy([{"dataset_id": "readings", "row_filter": {"handler": "mystery", "keys": ["pod:pod-1"]}}])
    )
    r = await edr_query(client, world, "SELECT id FROM readings")
    refused(r, 403, "row_filter_unenforceable")
    assert "mystery" in r.json()["detail"]
    assert await disclosures.quiet() == []


async def test_rf06_a_handler_refusing_delegation_is_403(
    client: httpx.AsyncClient, world: World, ds: DsConnectorDouble
) -> None:
    rf = {"handler": "http_in_list", "args": {"column": "pod", "url": "http://x"}, "principals": ["alice"]}
    ds.set_policy(ds_policy([{"dataset_id": "readings", "row_filter": rf}]))
    refused(await edr_query(client, world, "SELECT id FROM readings"), 403, "row_filter_unenforceable")


async def test_rf01_no_filter_needs_a_person_layer_admitting_all(
    client: httpx.AsyncClient, world: World, ds: DsConnectorDouble
) -> None:
    ds.set_policy(ds_policy([{"dataset_id": "readings", "row_filter": None}]))
    refused(await edr_query(client, world, "SELECT id FROM readings"), 403, "row_policy_denied")


async def test_rf01_an_organization_binding_copy_is_not_the_person_layer(
    client: httpx.AsyncClient, world: World, ds: DsConnectorDouble
) -> None:
    copy = {"handler": "organization_match", "args": {"column": "org"}}
    ds.set_policy(ds_policy([{"dataset_id": "readings", "row_filter": copy}]))
    refused(await edr_query(client, world, "SELECT id FROM readings"), 403, "row_policy_denied")


async def test_gs13_the_organization_layer_reads_the_consumers_organizations(
    client: httpx.AsyncClient, world: World, ds: DsConnectorDouble, disclosures: TopicTail
) -> None:
    copy = {"handler": "member_wide"}
    orgs = ["org-b", {"alias": "org-c", "type": "dso"}, {"id": 5}]
    ds.set_policy(ds_policy([{"dataset_id": "assets", "row_filter": copy, "organizations": orgs}]))
    r = await edr_query(client, world, "SELECT id FROM assets ORDER BY id")
    assert [row["id"] for row in r.json()["items"]] == [2, 3]
    [record] = await disclosures.read(1)
    assert json.loads(record.value)["authorized_subject_ids"] is None


async def test_gs13_no_organizations_serves_no_rows(
    client: httpx.AsyncClient, world: World, ds: DsConnectorDouble
) -> None:
    ds.set_policy(ds_policy([{"dataset_id": "assets"}]))
    r = await edr_query(client, world, "SELECT id FROM assets")
    assert r.status_code == 200, r.text
    assert r.json()["items"] == []


async def test_rf06_an_organization_binding_filter_naming_subjects_is_403(
    client: httpx.AsyncClient, world: World, ds: DsConnectorDouble
) -> None:
    rf = {"handler": "organization_match", "args": {"column": "org"}, "principals": ["alice"]}
    ds.set_policy(ds_policy([{"dataset_id": "assets", "row_filter": rf}]))
    refused(await edr_query(client, world, "SELECT id FROM assets"), 403, "row_filter_unenforceable")


async def test_the_expose_gate_follows_the_decision(
    client: httpx.AsyncClient, world: World, ds: DsConnectorDouble
) -> None:
    ds.set_policy(ds_policy(["hidden"]))
    refused(await edr_query(client, world, "SELECT id FROM hidden"), 403, "not_available")
    assert len(ds.calls("authorize")) == 1


async def test_an_edr_token_not_signed_by_the_connector_is_401(
    client: httpx.AsyncClient, world: World, ds: DsConnectorDouble
) -> None:
    ds.set_policy(ds_policy(["stats"]))
    other = DsConnectorDouble(ds_policy(["stats"]))
    forged = other.mint_edr(CONSUMER, AGREEMENT)
    refused(await edr_query(client, world, "SELECT id FROM stats", forged), 401, "invalid_token")
    refused(await edr_query(client, world, "SELECT id FROM stats", "junk"), 401, "invalid_token")
    r = await client.post(
        "/query", json={"sql": "SELECT id FROM stats"}, headers={"Edc-Contract-Agreement-Id": AGREEMENT}
    )
    refused(r, 401, "invalid_token")


async def test_without_the_agreement_header_the_edr_token_goes_to_the_oidc_check(
    client: httpx.AsyncClient, world: World
) -> None:
    r = await edr_query(client, world, "SELECT id FROM notes", **{"Edc-Contract-Agreement-Id": ""})
    refused(r, 401, "invalid_token")


async def test_a_lost_row_filter_value_is_never_logged(
    client: httpx.AsyncClient, world: World, ds: DsConnectorDouble, caplog: pytest.LogCaptureFixture
) -> None:
    """RF-08: captured DEBUG logs of a dataspace query carry no key, principal or token."""
    caplog.set_level(logging.DEBUG)
    rf = {
        **SKM,
        "keys": ["pod:pod-2"],
        "principals": ["carol-principal"],
        "subject_dids": ["did:web:carol.example"],
    }
    ds.set_policy(ds_policy([{"dataset_id": "readings", "row_filter": rf}]))
    token = world.edr()
    r = await edr_query(client, world, "SELECT id, value FROM readings WHERE value > 5 ORDER BY id", token)
    assert [row["id"] for row in r.json()["items"]] == [2]
    text = "\n".join(f"{rec.getMessage()} {rec.msg!r} {rec.args!r}" for rec in caplog.records)
    assert "narrowed_statement_withheld" in text  # the logs were captured
    for secret in ("pod-2", "carol-principal", token, token.split(".")[1]):
        assert secret not in text


def captured_text(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(f"{rec.getMessage()} {rec.msg!r} {rec.args!r}" for rec in caplog.records)


async def test_rf08_a_lookup_handlers_dataspace_query_logs_no_key_principal_or_token(
    client: httpx.AsyncClient,
    world: World,
    ds: DsConnectorDouble,
    flushed: FakeResolver,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The delegated principals travel to the resolver in the claim check, never into a log."""
    caplog.set_level(logging.DEBUG)
    rf = {
        "handler": "rec_registry",
        "args": {"column": "pod"},
        "principals": ["dora-principal"],
        "keys": ["pod:pod-9"],
        "subject_dids": ["did:web:dora.example"],
    }
    ds.set_policy(ds_policy([{"dataset_id": "registry", "row_filter": rf}]))
    token = world.edr()
    r = await edr_query(client, world, "SELECT id, pod FROM registry ORDER BY id", token)
    # the resolver double finds dora's pod: exactly that row
    assert r.json()["items"] == [{"id": 2, "pod": "pod-2"}], r.text
    [claim] = flushed.claims
    assert claim.principals == ("dora-principal",) and claim.caller is None  # delegated
    text = captured_text(caplog)
    assert "narrowed_statement_withheld" in text  # DEBUG lines of this request were captured
    for secret in ("dora-principal", "pod-2", "pod-9", token, token.split(".")[1]):
        assert secret not in text


async def test_rf05_direct_user_match_delegated_to_nobody_serves_no_rows(
    extended_client: httpx.AsyncClient, world: World, ds: DsConnectorDouble
) -> None:
    rf = {"handler": "direct_user_match", "args": {"column": "owner"}, "principals": []}
    ds.set_policy(ds_policy([{"dataset_id": "shared_notes", "row_filter": rf}]))
    r = await edr_query(extended_client, world, "SELECT id FROM shared_notes ORDER BY id")
    assert r.status_code == 200, r.text
    assert r.json()["items"] == [] and r.json()["total"] == 0


async def test_rf05_direct_user_match_delegated_serves_exactly_the_named_principals_rows(
    extended_client: httpx.AsyncClient, world: World, ds: DsConnectorDouble
) -> None:
    cases = {("user-2",): [2], ("user-1",): [1, 3], ("user-1", "user-2"): [1, 2, 3], ("nobody",): []}
    for principals, expected in cases.items():
        rf = {"handler": "direct_user_match", "args": {"column": "owner"}, "principals": list(principals)}
        ds.set_policy(ds_policy([{"dataset_id": "shared_notes", "row_filter": rf}]))
        r = await edr_query(extended_client, world, "SELECT id FROM shared_notes ORDER BY id")
        assert r.status_code == 200, r.text
        assert [row["id"] for row in r.json()["items"]] == expected, principals
