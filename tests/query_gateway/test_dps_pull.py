"""DPS-09: the pull on `POST /dps/public/query`, against a pull-grant view seeded here in the
shape signaling publishes (token_id, flow_id, state, agreement_id, dataset_id, participant_id,
counter_party_id)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from gateway_support import AGREEMENT, CONSUMER, PROVIDER, TopicTail, World, ds_policy, running_gateway

from dataplane_local.doubles.ds_connector import DsConnectorDouble

KEY = ec.generate_private_key(ec.SECP256R1())
PUBLIC_PEM = (
    KEY.public_key()
    .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    .decode()
)


def pull_token(jti: str, aud: str = CONSUMER, iss: str = PROVIDER, key: Any = KEY) -> str:
    claims = {"jti": jti, "iss": iss, "sub": iss, "aud": aud, "iat": int(time.time())}
    return jwt.encode(claims, key, algorithm="ES256")


@pytest.fixture(scope="module")
async def flows_url(postgres_url: str) -> AsyncIterator[str]:
    name = f"flows_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(postgres_url)
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.close()
    url = f"{postgres_url.rpartition('/')[0]}/{name}"
    conn = await asyncpg.connect(url)
    await conn.execute(
        "CREATE TABLE dps_pull_grants (token_id text PRIMARY KEY, flow_id text, state text,"
        " agreement_id text, dataset_id text, participant_id text, counter_party_id text)"
    )
    await conn.close()
    yield url
    admin = await asyncpg.connect(postgres_url)
    await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await admin.close()


@pytest.fixture(scope="module")
async def pull_client(world: World, flows_url: str) -> AsyncIterator[httpx.AsyncClient]:
    settings = world.settings(
        dps_enabled=True, dps_token_public_key=PUBLIC_PEM, dps_flows_database_url=flows_url
    )
    async with running_gateway(settings) as client:
        yield client


async def grant(flows_url: str, state: str = "STARTED", **over: str) -> str:
    jti = str(uuid.uuid4())
    row = {
        "token_id": jti,
        "flow_id": f"flow-{jti[:8]}",
        "state": state,
        "agreement_id": AGREEMENT,
        "dataset_id": "stats",
        "participant_id": PROVIDER,
        "counter_party_id": CONSUMER,
    }
    row.update(over)
    conn = await asyncpg.connect(flows_url)
    await conn.execute("INSERT INTO dps_pull_grants VALUES ($1, $2, $3, $4, $5, $6, $7)", *row.values())
    await conn.close()
    return jti


async def pull(client: httpx.AsyncClient, authorization: str | None, **headers: str) -> httpx.Response:
    h = dict(headers)
    if authorization is not None:
        h["Authorization"] = authorization
    return await client.post("/dps/public/query", json={"sql": "SELECT id FROM stats ORDER BY id"}, headers=h)


def refused(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.json()["error"] == code


async def test_dps09_a_started_flow_serves_rows_under_its_own_agreement(
    pull_client: httpx.AsyncClient, flows_url: str, ds: DsConnectorDouble, disclosures: TopicTail
) -> None:
    ds.set_policy(ds_policy(["stats"]))
    jti = await grant(flows_url)
    r = await pull(pull_client, pull_token(jti), **{"Edc-Transfer-Process-Id": "tp-9", "Edc-Purpose": "a,b"})
    assert r.status_code == 200, r.text
    assert [row["id"] for row in r.json()["items"]] == [1, 2]
    [call] = ds.calls("authorize")
    assert call.body["agreement_id"] == AGREEMENT and call.body["consumer_did"] == CONSUMER
    assert call.body["transfer_id"] == "tp-9" and call.body["purpose"] == ["a", "b"]
    [record] = await disclosures.read(1)
    assert json.loads(record.value)["provider_participant"] == PROVIDER


async def test_dps09_the_token_is_read_with_or_without_bearer(
    pull_client: httpx.AsyncClient, flows_url: str, ds: DsConnectorDouble
) -> None:
    ds.set_policy(ds_policy(["stats"]))
    jti = await grant(flows_url)
    assert (await pull(pull_client, f"Bearer {pull_token(jti)}")).status_code == 200


async def test_dps09_no_valid_token_no_rows(pull_client: httpx.AsyncClient, ds: DsConnectorDouble) -> None:
    for auth in (None, "", "Bearer ", "junk"):
        refused(await pull(pull_client, auth), 401, "pull_token")
    assert ds.calls("authorize") == []


async def test_dps09_a_token_from_another_data_plane_is_401(
    pull_client: httpx.AsyncClient, flows_url: str
) -> None:
    jti = await grant(flows_url)
    refused(
        await pull(pull_client, pull_token(jti, key=ec.generate_private_key(ec.SECP256R1()))),
        401,
        "pull_token",
    )


async def test_dps09_a_token_that_is_not_live_is_401(pull_client: httpx.AsyncClient, flows_url: str) -> None:
    jti = await grant(flows_url)
    conn = await asyncpg.connect(flows_url)
    await conn.execute("DELETE FROM dps_pull_grants WHERE token_id = $1", jti)  # retired: no cache
    await conn.close()
    refused(await pull(pull_client, pull_token(jti)), 401, "pull_token")


async def test_dps09_a_flow_not_started_is_403(pull_client: httpx.AsyncClient, flows_url: str) -> None:
    jti = await grant(flows_url, state="SUSPENDED")
    refused(await pull(pull_client, pull_token(jti)), 403, "flow_not_started")


async def test_dps09_a_token_not_matching_its_flow_is_401(
    pull_client: httpx.AsyncClient, flows_url: str
) -> None:
    jti = await grant(flows_url)
    refused(await pull(pull_client, pull_token(jti, aud="did:web:someone-else")), 401, "pull_token")
    refused(await pull(pull_client, pull_token(jti, iss="did:web:other-provider")), 401, "pull_token")


async def test_dps09_an_agreement_header_naming_another_agreement_is_403(
    pull_client: httpx.AsyncClient, flows_url: str, ds: DsConnectorDouble
) -> None:
    ds.set_policy(ds_policy(["stats"]))
    jti = await grant(flows_url)
    refused(
        await pull(pull_client, pull_token(jti), **{"Edc-Contract-Agreement-Id": "agr-x"}),
        403,
        "agreement_mismatch",
    )
    assert (
        await pull(pull_client, pull_token(jti), **{"Edc-Contract-Agreement-Id": AGREEMENT})
    ).status_code == 200


async def test_dps01_the_pull_route_is_absent_without_dps(client: httpx.AsyncClient) -> None:
    r = await client.post("/dps/public/query", json={"sql": "SELECT id FROM stats"})
    assert r.status_code == 404
