"""DPS-13 — flows in signaling's own database: the published pull-grant view, exact columns, no
stored credential, one token per flow, serialised signals (in one process; see
test_dps13_processes.py for separate processes)."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import jwt
import pytest

from dataplane_contracts.dps import PULL_GRANT_COLUMNS, PULL_GRANT_VIEW
from dataplane_testing.signaling import FLOWS, auth, consumer_address, new_id, sql, start_message, token_of


def _db(app: Any) -> str:
    return str(app.settings.database_url).replace("+asyncpg", "")


async def _columns(url: str, table: str) -> list[str]:
    rows = await sql(
        url,
        "SELECT column_name FROM information_schema.columns WHERE table_name=$1 ORDER BY ordinal_position",
        table,
    )
    return [r["column_name"] for r in rows]


async def test_dps13_the_tables_have_the_reference_columns_and_no_credential_column(flows_db: str) -> None:
    assert await _columns(flows_db, "dps_data_flows") == [
        "id",
        "role",
        "state",
        "caller",
        "participant_id",
        "counter_party_id",
        "agreement_id",
        "dataset_id",
        "transfer_type",
        "dataspace_context",
        "callback_address",
        "claims",
        "labels",
        "metadata",
        "data_address",
        "token_id",
        "created_at",
        "updated_at",
        "refresh_hash",  # the http-pull refresh token's SHA-256, never the token
        "pending_token_id",  # a renewal's pair until first used: an id and a hash
        "pending_refresh_hash",
        "grant_extensions",  # the frozen range filters: field names and operators, no credential
    ]
    assert await _columns(flows_db, "dps_control_planes") == [
        "controlplane_id",
        "endpoint",
        "registered_by",
        "updated_at",
    ]


async def test_dps13_the_pull_grant_view_is_the_published_contract(
    flows_db: str, pull_grant_role: str
) -> None:
    assert tuple(await _columns(flows_db, PULL_GRANT_VIEW)) == PULL_GRANT_COLUMNS
    conn = await asyncpg.connect(flows_db)
    try:
        async with conn.transaction():
            await conn.execute(f"SET LOCAL ROLE {pull_grant_role}")
            assert await conn.fetch(f"SELECT * FROM {PULL_GRANT_VIEW}") == []
        # the read role sees the view only, never the table behind it
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            async with conn.transaction():
                await conn.execute(f"SET LOCAL ROLE {pull_grant_role}")
                await conn.fetch("SELECT * FROM dps_data_flows")
    finally:
        await conn.close()


async def test_dps13_a_token_id_is_unique_in_the_table(signaling: Any, cp_token: Any) -> None:
    a, b = new_id(), new_id()
    r = await signaling.client.post(f"{FLOWS}/start", json=start_message(a), headers=auth(cp_token()))
    await signaling.client.post(f"{FLOWS}/start", json=start_message(b), headers=auth(cp_token()))
    jti = jwt.decode(token_of(r.json()), options={"verify_signature": False})["jti"]
    with pytest.raises(asyncpg.UniqueViolationError):
        await sql(_db(signaling), "UPDATE dps_data_flows SET token_id=$1 WHERE id=$2", jti, b)


async def test_dps13_no_credential_is_stored(signaling: Any, cp_token: Any) -> None:
    provider = new_id()
    r = await signaling.client.post(f"{FLOWS}/start", json=start_message(provider), headers=auth(cp_token()))
    issued = [token_of(r.json())]
    await signaling.client.post(f"{FLOWS}/{provider}/suspend", headers=auth(cp_token()))
    r = await signaling.client.post(f"{FLOWS}/{provider}/resume", headers=auth(cp_token()))
    issued.append(token_of(r.json()))
    consumer = new_id()
    await signaling.client.post(f"{FLOWS}/prepare", json=start_message(consumer), headers=auth(cp_token()))
    body = {"dataAddress": consumer_address("the-providers-token")}
    await signaling.client.post(f"{FLOWS}/{consumer}/started", json=body, headers=auth(cp_token()))
    rows = []
    for table in ("dps_data_flows", "dps_control_planes", "dps_outbox"):
        rows += await sql(_db(signaling), f"SELECT row_to_json(t)::text AS j FROM {table} t")
    dump = " ".join(r["j"] for r in rows)
    assert provider in dump and consumer in dump
    for secret in [*issued, "the-providers-token"]:
        assert secret not in dump
    assert "authorization" not in dump.lower()


async def test_dps13_concurrent_resumes_resume_once(signaling: Any, cp_token: Any) -> None:
    flow = new_id()
    await signaling.client.post(f"{FLOWS}/start", json=start_message(flow), headers=auth(cp_token()))
    await signaling.client.post(f"{FLOWS}/{flow}/suspend", headers=auth(cp_token()))
    results = await asyncio.gather(
        *(signaling.client.post(f"{FLOWS}/{flow}/resume", headers=auth(cp_token())) for _ in range(2))
    )
    assert sorted(r.status_code for r in results) == [200, 409]
    rows = await sql(_db(signaling), "SELECT count(*) AS n FROM dps_pull_grants WHERE flow_id=$1", flow)
    assert rows[0]["n"] == 1


async def test_dps13_a_flow_created_twice_at_once_exists_once(signaling: Any, cp_token: Any) -> None:
    flow = new_id()
    results = await asyncio.gather(
        *(
            signaling.client.post(f"{FLOWS}/start", json=start_message(flow), headers=auth(cp_token()))
            for _ in range(2)
        )
    )
    assert sorted(r.status_code for r in results) == [200, 409]
    rows = await sql(_db(signaling), "SELECT count(*) AS n FROM dps_data_flows WHERE id=$1", flow)
    assert rows[0]["n"] == 1
