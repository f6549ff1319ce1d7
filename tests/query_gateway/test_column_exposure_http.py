"""Column exposure through the gateway's routes (issue 15), on the normal path and the legacy EDR
path: a gateway over database A (every column) against database B holding only narrow.readings'
exposed columns of the permitted rows (dataplane_testing/exposure.py). An exposed column in any
position answers B's rows; an unexposed one, a missing one and a case twin get one byte-identical
`400 column_not_exposed`; stars and whole rows show the exposed columns only; masks read as
specified; `POST /query/plan` shows exposure and masks; start-up refuses a `columns:` list naming
a column the table lacks, and a `hash` mask without COLUMN_MASK_KEY."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
import yaml

from dataplane_local.doubles.ds_connector import DsConnectorDouble
from dataplane_testing.databases import scratch_database
from dataplane_testing.exposure import (
    DATASETS,
    EXPOSED,
    HIDDEN,
    MASK_KEY,
    MASKED,
    NARROW,
    POSITIONS,
    WHOLE,
    exposed_database,
    load_exposed,
    masked_sites,
)
from dataplane_testing.gateway import AGREEMENT, World, ds_policy, running_gateway
from dataplane_testing.sqlgw import SCHEMA_A, Permit, multiset, seed
from query_gateway.sql.references import NOT_EXPOSED

PERMIT = Permit(pods=("pod-1", "pod-3", "pod-4"), orgs=("org-b",), sites=None)
REFUSAL = {
    "type": "urn:dataplane:error:column_not_exposed",
    "title": "Column not exposed",
    "status": 400,
    "error": "column_not_exposed",
    "detail": NOT_EXPOSED,
}


def verdicts(permit: Permit) -> dict[str, Any]:
    """ds narrows narrow.readings by pod keys and consumer organizations (both columns it does
    not expose) and sends no filter for masked.sites (its person layer is allow_all)."""
    row_filter = {
        "handler": "subject_key_match",
        "args": {"column": "pod", "key_type": "pod"},
        "keys": [f"pod:{p}" for p in permit.pods],
        "subject_dids": ["did:web:subject.example"],
    }
    return ds_policy(
        [
            {"dataset_id": NARROW, "row_filter": row_filter, "organizations": list(permit.orgs)},
            {"dataset_id": MASKED},
        ]
    )


@pytest.fixture(scope="module")
async def gateway(
    world: World, postgres_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[httpx.AsyncClient]:
    path = tmp_path_factory.mktemp("exposure") / "catalogue.yaml"
    path.write_text(yaml.safe_dump({"datasets": DATASETS}))
    async with scratch_database(postgres_url, SCHEMA_A) as url:
        conn = await asyncpg.connect(url)
        await seed(conn, "public.readings", "public.meters", 'energy."Sites"')
        await conn.close()
        settings = world.settings(
            catalogue_path=str(path), datasets_database_url=url, column_mask_key=MASK_KEY
        )
        async with running_gateway(settings) as client:
            yield client


@pytest.fixture(scope="module")
async def db_b(postgres_url: str) -> AsyncIterator[asyncpg.Connection]:
    async with exposed_database(postgres_url) as conn:
        await load_exposed(conn, PERMIT)
        yield conn


def edr_headers(world: World) -> dict[str, str]:
    return {"Authorization": f"Bearer {world.edr()}", "Edc-Contract-Agreement-Id": AGREEMENT}


def items(r: httpx.Response) -> list[tuple[tuple[str, object], ...]]:
    assert r.status_code == 200, r.text
    return multiset([tuple(item.items()) for item in r.json()["items"]])


async def on_b(b: asyncpg.Connection, sql: str) -> list[tuple[tuple[str, object], ...]]:
    """B's rows as the route's JSON objects carry them: names in order, values through JSON."""
    rows = await b.fetch(sql)
    return multiset(
        [tuple(zip(r.keys(), json.loads(json.dumps(list(r.values()))), strict=True)) for r in rows]
    )


@pytest.mark.parametrize("position", POSITIONS)
async def test_edr_path_exposed_columns_answer_as_b_and_hidden_ones_get_one_refusal(
    gateway: httpx.AsyncClient, world: World, ds: DsConnectorDouble, db_b: asyncpg.Connection, position: str
) -> None:
    ds.set_policy(verdicts(PERMIT))
    for column in EXPOSED:
        sql = POSITIONS[position].format(c=column)
        r = await gateway.post("/query", json={"sql": sql, "limit": 10_000}, headers=edr_headers(world))
        assert items(r) == await on_b(db_b, sql), sql
    refusals = set()
    for column in HIDDEN:
        sql = POSITIONS[position].format(c=column)
        r = await gateway.post("/query", json={"sql": sql}, headers=edr_headers(world))
        assert (r.status_code, r.json()) == (400, REFUSAL), sql
        refusals.add(r.content)
    assert len(refusals) == 1  # byte for byte: an unexposed column reads as one that is not there


@pytest.mark.parametrize("position", POSITIONS)
async def test_normal_path_hidden_columns_get_one_byte_identical_refusal(
    gateway: httpx.AsyncClient, world: World, position: str
) -> None:
    headers = {"Authorization": f"Bearer {world.user_token('user-1')}"}
    refusals = set()
    for column in HIDDEN:
        r = await gateway.post("/query", json={"sql": POSITIONS[position].format(c=column)}, headers=headers)
        assert (r.status_code, r.json()) == (400, REFUSAL)
        refusals.add(r.content)
    assert len(refusals) == 1
    r = await gateway.post("/query", json={"sql": POSITIONS[position].format(c="id")}, headers=headers)
    assert r.status_code == 200, r.text  # the exposed column runs (this caller holds no pod key)


@pytest.mark.parametrize("statement", WHOLE)
async def test_edr_path_stars_and_whole_rows_show_only_exposed_columns(
    gateway: httpx.AsyncClient, world: World, ds: DsConnectorDouble, db_b: asyncpg.Connection, statement: str
) -> None:
    ds.set_policy(verdicts(PERMIT))
    sql = WHOLE[statement]
    r = await gateway.post("/query", json={"sql": sql, "limit": 10_000}, headers=edr_headers(world))
    expected = await on_b(db_b, sql)
    assert expected and items(r) == expected, sql


async def test_masks_read_as_specified_on_both_paths(
    gateway: httpx.AsyncClient, world: World, ds: DsConnectorDouble
) -> None:
    ds.set_policy(verdicts(PERMIT))
    body = {"sql": "SELECT * FROM masked.sites ORDER BY site_id"}
    for headers in (edr_headers(world), {"Authorization": f"Bearer {world.user_token('user-1')}"}):
        r = await gateway.post("/query", json=body, headers=headers)
        assert r.status_code == 200, r.text
        assert r.json()["items"] == masked_sites()


async def test_query_plan_shows_exposure_and_masks_never_the_key(
    gateway: httpx.AsyncClient, world: World
) -> None:
    headers = {"Authorization": f"Bearer {world.user_token('user-1')}"}
    sql = "SELECT r.id, s.site_uuid FROM narrow.readings r, masked.sites s"
    r = await gateway.post("/query/plan", json={"sql": sql}, headers=headers)
    assert r.status_code == 200, r.text
    plan = r.json()
    assert plan["exposure"] == {
        NARROW: {"declared": True, "columns": [{"name": "id"}, {"name": "value"}]},
        MASKED: {
            "declared": True,
            "columns": [
                {"name": "site_id"},
                {"name": "site_uuid", "mask": "hash"},
                {"name": "pod", "mask": "null"},
                {"name": "name"},
            ],
        },
    }
    assert '(SELECT _dp_rf."id", _dp_rf."value" FROM public.readings AS _dp_rf' in plan["sql"]
    assert plan["denied"] and "SHA256" not in plan["sql"]  # this caller holds no pod key: nothing to hash
    r = await gateway.post("/query/plan", json={"sql": "SELECT site_uuid FROM masked.sites"}, headers=headers)
    assert r.status_code == 200, r.text
    labels = [p["label"] for p in r.json()["params"]]
    assert labels == ["column mask key (HMAC inner pad)", "column mask key (HMAC outer pad)"]
    assert "SHA256(CAST($2 AS BYTEA) || SHA256(CAST($1 AS BYTEA)" in r.json()["sql"]
    assert MASK_KEY not in r.text


def _catalogue(tmp_path: Path, columns: list[Any]) -> str:
    path = tmp_path / "catalogue.yaml"
    entry = {
        "id": "readings",
        "table": "readings",
        "access_level": "open",
        "expose": True,
        "columns": columns,
        "row_filters": {
            "person": {"handler": "allow_all", "binds": "person"},
            "organization": {"handler": "allow_all", "binds": "organization"},
        },
    }
    path.write_text(yaml.safe_dump({"datasets": [entry]}))
    return str(path)


async def test_gs09_startup_refuses_a_columns_list_naming_a_column_the_table_lacks(
    world: World, tmp_path: Path
) -> None:
    from query_gateway.app import StartupRefused

    bad = _catalogue(tmp_path, ["id", "nope"])
    with pytest.raises(StartupRefused, match=r"readings: columns lists nope, which table readings lacks"):
        async with running_gateway(world.settings(catalogue_path=bad)):
            pass


async def test_startup_refuses_a_hash_mask_without_the_mask_key(world: World, tmp_path: Path) -> None:
    from query_gateway.app import StartupRefused

    hashed = _catalogue(tmp_path, ["id", {"name": "pod", "mask": "hash"}])
    with pytest.raises(StartupRefused, match=r"COLUMN_MASK_KEY is required: dataset readings"):
        async with running_gateway(world.settings(catalogue_path=hashed)):
            pass
    async with running_gateway(world.settings(catalogue_path=hashed, column_mask_key=MASK_KEY)) as client:
        r = await client.post("/query", json={"sql": "SELECT pod FROM readings ORDER BY id"})
        assert r.status_code == 200, r.text
        assert [i["pod"] for i in r.json()["items"]] != ["pod-1", "pod-2", "pod-3"]


def test_column_mask_key_is_a_secret_of_at_least_16_characters(world: World) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="column_mask_key"):
        world.settings(column_mask_key="too-short")
    settings = world.settings(column_mask_key=MASK_KEY)
    assert MASK_KEY not in repr(settings) and MASK_KEY not in str(settings.model_dump())
