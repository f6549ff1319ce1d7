"""The differential oracle of the acceptance, through the gateway's real route: every generated
statement is POSTed to `/query` on the legacy EDR path, with the ds double's verdict saying the
example's allow-lists as typed data keys (RF-03, RF-04) and consumer organizations (GS-13), and the
answer must be the multiset of rows the same statement returns, verbatim, on database B holding
only the permitted rows. So the EDR check, the one authorize call, RF-01/RF-02 parsing, the pure
handlers (`subject_key_match`, `organization_match`, `member_wide`), both layers, the rewrite,
execution, the response shape and the disclosure are all inside the comparison.

The statements, the tables and what a request permits come from the SQL-pipeline oracle's model
(`Permit` in dataplane_testing/sqlgw.py): B's rows and which requests are denies are derived from the raw
allow-list values alone, never from the gateway's parsing of keys or conversion of values. Beside
the keys of the permitted values, each verdict carries keys of another type and malformed keys
(both must be skipped), principals naming forged pods (never a fallback), and organization
entries that name no alias (skipped). A deny must answer 200 with no rows (RF-05): never an
error, so never an `IN ()`, which PostgreSQL refuses as a syntax error."""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from dataplane_local.doubles.ds_connector import DsConnectorDouble
from dataplane_testing.gateway import AGREEMENT, World, ds_policy, running_gateway
from dataplane_testing.sqlgw import (
    CAST_RAISE,
    FORGED_PODS,
    RAISE,
    SCHEMA_A,
    SITE_UUIDS,
    Permit,
    Raising,
    load_permitted,
    multiset,
    permits,
    permitted_database,
    raising_statement,
    raising_statements,
    seed,
    statements,
)
from dataplane_testing.topics import TopicTail
from query_gateway.sql import MAX_LIMIT

CATALOGUE = Path(__file__).with_name("oracle_catalogue.yaml")
DATASETS = ("readings", "grid.meters", "ops.sites")
PAGE_KEYS = {"items", "offset", "limit", "count", "total"}

# Keys the verdict carries beside the permitted values', each naming a value that matches rows
# if misread: another type is not ours to match (RF-04), a malformed key is skipped (RF-03).
POD_NOISE = st.sampled_from(FORGED_PODS).flatmap(
    lambda p: st.sampled_from(
        [f"meter:{p}", f"site:{p}", f"pods:{p}", p, f"POD:{p}", f" pod:{p}", f"pod: {p}", f":{p}",
         f"1pod:{p}", f"pod:{p} ", f"pod:{p}\n"]
    )
)  # fmt: skip
SITE_NOISE = st.sampled_from(SITE_UUIDS).flatmap(
    lambda u: st.sampled_from(
        [f"pod:{u}", f"sites:{u}", u, f"SITE:{u}", f"site: {u}", f"site:{u} ", f"site:{u}\n"]
    )
)
# consumer organizations as ds may word them, and entries naming no alias (skipped)
ORG_FORMS = (
    lambda a: a,
    lambda a: {"alias": a},
    lambda a: {"alias": a, "type": "dso"},
    lambda a: {"id": a, "types": ["rec"]},
)
ORG_NOISE = st.sampled_from([{"id": 5}, {"type": "dso"}, "", None, {"alias": ""}])

Wire = dict[str, dict[str, Any]]  # dataset id → its verdict entry beside `dataset_id`


def wording(
    permit: Permit,
    *,
    pod_noise: tuple[str, ...] = (),
    site_noise: tuple[str, ...] = (),
    principals: tuple[str, ...] | None = None,
    subjects: int = 1,
    org_form: int = 0,
    org_noise: tuple[object, ...] = (),
    sites_copy: bool = False,
) -> Wire:
    """ds's verdicts saying `permit`: a `subject_key_match` over the permitted values as typed keys
    plus noise; the aliases as organizations; for unnarrowed sites no filter, or ds's organization
    copy naming nobody (`sites_copy`), neither of which is the person layer (RF-01)."""
    dids = [f"did:web:subject-{i}.example" for i in range(subjects)]

    def skm(column: str, key_type: str, values: tuple[str, ...], noise: tuple[str, ...]) -> dict[str, Any]:
        # every value of the shared domains makes a well-formed key, but '' (no uuid, dropped anyway)
        keys = [*noise[::2], *(f"{key_type}:{v}" for v in values), *noise[1::2]]
        rf: dict[str, Any] = {
            "handler": "subject_key_match",
            "args": {"column": column, "key_type": key_type},
            "keys": keys,
            "subject_dids": dids,
        }
        if principals is not None:  # ignored by subject_key_match, even when it has no key
            rf["principals"] = list(principals)
        return rf

    organizations = [ORG_FORMS[org_form](a) for a in permit.orgs] + list(org_noise)
    pods = {"row_filter": skm("pod", "pod", permit.pods, pod_noise), "organizations": organizations}
    sites: dict[str, Any] = {}
    if permit.sites is not None:
        sites = {"row_filter": skm("site_uuid", "site", permit.sites, site_noise)}
    elif sites_copy:
        sites = {"row_filter": {"handler": "member_wide"}}
    return {"readings": pods, "grid.meters": dict(pods), "ops.sites": sites}


@st.composite
def cases(draw: st.DrawFn) -> tuple[Permit, Wire]:
    permit = draw(permits)
    wire = wording(
        permit,
        pod_noise=tuple(draw(st.lists(POD_NOISE, max_size=3))),
        site_noise=tuple(draw(st.lists(SITE_NOISE, max_size=2))),
        principals=draw(st.none() | st.lists(st.sampled_from(FORGED_PODS), max_size=2).map(tuple)),
        subjects=draw(st.integers(0, 2)),
        org_form=draw(st.integers(0, len(ORG_FORMS) - 1)),
        org_noise=tuple(draw(st.lists(ORG_NOISE, max_size=2))),
        sites_copy=draw(st.booleans()),
    )
    return permit, wire


def touched_by(sql: str) -> set[str]:
    """The datasets a generated statement reads, from its text (every template that names one
    reads it, `WITH readings AS (… FROM readings)` included)."""
    found = {d for d in ("grid.meters", "ops.sites") if d in sql}
    return found | ({"readings"} if re.search(r"\breadings\b", sql) else set())


def as_item(record: asyncpg.Record) -> tuple[tuple[str, object], ...]:
    """B's row as the route's JSON object would carry it: names in order, values through JSON (a
    uuid as its text). A statement with a repeated output name cannot be compared as objects."""
    names = list(record.keys())
    assert len(set(names)) == len(names), f"output names repeat: {names}"
    values = json.loads(json.dumps(list(record.values()), default=_uuid_text))
    return tuple(zip(names, values, strict=True))


def _uuid_text(value: object) -> str:
    assert isinstance(value, uuid.UUID), f"B returned a {type(value).__name__}"
    return str(value)


@pytest.fixture
async def oracle_client(world: World, fresh_database: str) -> AsyncIterator[httpx.AsyncClient]:
    """A gateway over the oracle's catalogue and database A (every row)."""
    conn = await asyncpg.connect(fresh_database)
    await conn.execute(SCHEMA_A)
    await seed(conn, "public.readings", "public.meters", 'energy."Sites"')
    await conn.close()
    settings = world.settings(catalogue_path=str(CATALOGUE), datasets_database_url=fresh_database)
    async with running_gateway(settings) as client:
        yield client


@pytest.fixture
async def db_b(postgres_url: str) -> AsyncIterator[asyncpg.Connection]:
    async with permitted_database(postgres_url) as conn:
        yield conn


async def check_disclosures(
    disclosures: TopicTail, transfer: str, touched: set[str], wire: Wire, served: int
) -> None:
    """One event per touched dataset, counting the rows served, naming subjects by DID only."""
    records = await disclosures.read_where(len(touched), lambda r: transfer.encode() in r.value)
    events = {e["dataset_id"]: e for e in (json.loads(r.value) for r in records)}
    assert set(events) == touched
    for dataset_id, disclosed in events.items():
        assert disclosed["transfer_id"] == transfer and disclosed["row_count"] == served
        rf = wire[dataset_id].get("row_filter") or {}
        person = rf.get("handler") == "subject_key_match"
        assert disclosed["authorized_subject_ids"] == (rf["subject_dids"] if person else None)
    for record in records:
        for key in (*FORGED_PODS, *SITE_UUIDS):
            assert key not in record.value.decode()


# The examples: only keys of another type or malformed ones, and principals naming the pods they
# would match — a deny, so not even the count; a verdict without a filter leaves sites whole; the
# spellings of permitted site uuids match their rows, another type's key of a third does not.
NOISY_DENY = Permit(pods=(), orgs=("org-a",), sites=None)
SITES_WHOLE = Permit(pods=("pod-1", "pod-3"), orgs=(), sites=None)
SPELLED = Permit(pods=("pod-2",), orgs=("org-b",), sites=(SITE_UUIDS[0].upper(), "{" + SITE_UUIDS[1] + "}"))


@settings(
    max_examples=150,
    deadline=None,
    derandomize=bool(os.environ.get("CI")),
    # the gateway, ds double, topic tail and database B live across examples on purpose (one
    # gateway start per test); each example sets its own verdict and reloads B
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(sql=statements(), case=cases(), skip_count=st.booleans())
@example(
    sql="SELECT 'pod-1' AS pod, count(*) AS n, sum(r.value) AS total FROM readings r",
    case=(
        NOISY_DENY,
        wording(NOISY_DENY, pod_noise=("meter:pod-1", "POD:pod-2", "pod-3"), principals=("pod-4",)),
    ),
    skip_count=False,
)
@example(
    sql="SELECT count(*) AS n FROM ops.sites s CROSS JOIN grid.meters m",
    case=(SITES_WHOLE, wording(SITES_WHOLE, sites_copy=True)),
    skip_count=False,
)
@example(
    sql=f"SELECT s.name, s.site_uuid FROM ops.sites s WHERE s.site_uuid = '{SITE_UUIDS[2]}' OR s.pod = 'pod-4'",  # noqa: E501
    case=(SPELLED, wording(SPELLED, site_noise=(f"pod:{SITE_UUIDS[2]}", f"site: {SITE_UUIDS[3]}"))),
    skip_count=True,
)
async def test_differential_oracle_through_the_edr_route(
    oracle_client: httpx.AsyncClient,
    world: World,
    ds: DsConnectorDouble,
    disclosures: TopicTail,
    db_b: asyncpg.Connection,
    sql: str,
    case: tuple[Permit, Wire],
    skip_count: bool,
) -> None:
    permit, wire = case
    ds.set_policy(ds_policy([{"dataset_id": d, **wire[d]} for d in DATASETS]))
    ds.clear_calls()
    transfer = uuid.uuid4().hex
    r = await oracle_client.post(
        "/query",
        json={"sql": sql, "limit": MAX_LIMIT, "skip_count": skip_count},
        headers={
            "Authorization": f"Bearer {world.edr()}",
            "Edc-Contract-Agreement-Id": AGREEMENT,
            "Edc-Transfer-Process-Id": transfer,
        },
    )
    assert r.status_code == 200, (sql, r.text)
    body = r.json()
    assert set(body) == PAGE_KEYS and (body["offset"], body["limit"]) == (0, MAX_LIMIT)
    touched = touched_by(sql)
    [call] = ds.calls("authorize")
    assert sorted(call.body["dataset_ids"]) == sorted(touched)

    got = multiset([tuple(item.items()) for item in body["items"]])
    # RF-05: a deny empties the whole statement, aggregates included: no rows at all
    expected: list[tuple[object, ...]] = []
    if not permit.denies(tuple(touched)):
        await load_permitted(db_b, permit)
        expected = multiset([as_item(row) for row in await db_b.fetch(sql)])
        assert len(expected) < MAX_LIMIT  # one page holds the whole answer
    event("deny" if permit.denies(tuple(touched)) else "empty" if not expected else "rows")
    assert got == expected, sql
    assert body["count"] == len(expected)
    assert body["total"] == (None if skip_count else len(expected))
    await check_disclosures(disclosures, transfer, touched, wire, len(expected))


# Where B errs the gateway may serve rows (its plan never evaluated the guard on the aimed-at
# row), found by this oracle: the meter's semi-join stopped at reading 2, B's hash semi-join read
# reading 10 (pod-3, value 1) too.
IN_SUBQUERY = Permit(pods=("pod-3",), orgs=("org-a",), sites=None)


@settings(
    max_examples=40,
    deadline=None,
    derandomize=bool(os.environ.get("CI")),
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(raising=raising_statements(), case=cases())
@example(
    raising=raising_statement("in subquery", RAISE, "pod-3", 1),
    case=(IN_SUBQUERY, wording(IN_SUBQUERY, subjects=0)),
)
@example(
    raising=raising_statement("in subquery", CAST_RAISE, "pod-3", 1),
    case=(IN_SUBQUERY, wording(IN_SUBQUERY)),
)
async def test_raising_predicates_through_the_edr_route_answer_as_database_b(
    oracle_client: httpx.AsyncClient,
    world: World,
    ds: DsConnectorDouble,
    db_b: asyncpg.Connection,
    raising: Raising,
    case: tuple[Permit, Wire],
) -> None:
    """Issue 19: a predicate raising on one (pod, value), POSTed through the route.

    When B serves rows, the route must serve exactly those rows. Erring there would be the leak:
    B holds every permitted row, so the guard raised on a row B does not hold, a forbidden one,
    and the error would tell the caller that such a row exists.

    When B errs, the aimed-at row is permitted, and the route may answer either way. SQL does not
    say on which rows a predicate is evaluated: B's plan evaluated the guard on that row, the
    gateway's plan over the narrowed statement may never read it (a semi-join stops at its first
    match). So the route may err 400 query_failed, or serve rows; but then the guard's answer on
    the aimed-at row cannot have mattered, so the rows must be B's for each quiet twin of the
    statement, the guard answering NULL or TRUE on that row instead of raising. A row the gateway
    filtered out or let in wrongly still shows, since the two twins differ wherever it counts."""
    sql = raising.sql
    permit, wire = case
    ds.set_policy(ds_policy([{"dataset_id": d, **wire[d]} for d in DATASETS]))
    headers = {"Authorization": f"Bearer {world.edr()}", "Edc-Contract-Agreement-Id": AGREEMENT}
    r = await oracle_client.post("/query", json={"sql": sql, "limit": MAX_LIMIT}, headers=headers)
    got: tuple[object, ...] = (
        ("rows", tuple(multiset([tuple(item.items()) for item in r.json()["items"]])))
        if r.status_code == 200
        else (r.status_code, r.json()["error"])
    )
    touched = touched_by(sql)
    if permit.denies(tuple(touched)):
        assert got == ("rows", ()), sql
        return
    await load_permitted(db_b, permit)

    async def on_b(statement: str) -> tuple[object, ...]:
        return ("rows", tuple(multiset([as_item(row) for row in await db_b.fetch(statement)])))

    try:
        expected = await on_b(sql)
    except asyncpg.DataError:
        quiet = [await on_b(twin) for twin in raising.twins]
        event("error" if got[0] == 400 else "error on B, rows through the route")
        assert got == (400, "query_failed") or all(got == q for q in quiet), (sql, got, quiet)
        return
    event("rows")
    assert got == expected, sql
