# ruff: noqa: E501 - SQL test data reads best on one line
"""A differential oracle for the rewrite, independent of its own verifier: every generated
statement runs through validate → narrow → execute on database A (all rows) and, verbatim, on
database B holding only the permitted rows under the dataset ids' own names; the answers must be
the same multiset. What B holds and which requests are denies is derived from the raw allow-lists
alone (`Permit` in dataplane_testing.sqlgw), never from the gateway's own conversion: a touched dataset whose
allow-list keeps no value of its column's type is a deny, and a deny must answer nothing. The
same model drives the oracle over the gateway's HTTP route (../test_oracle_http.py). Issue 15:
the exposure oracle's B holds only the exposed columns of narrow.readings (dataplane_testing.exposure)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import asyncpg
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from dataplane_contracts.catalogue import Catalogue
from dataplane_service_kit.errors import ServiceError
from dataplane_testing.exposure import DATASETS, EXPOSED, POSITIONS, WHOLE, exposed_database, load_exposed
from dataplane_testing.sqlgw import (
    CAST_RAISE,
    CATALOGUE,
    RAISE,
    SITE_UUIDS,
    Db,
    Permit,
    Raising,
    load_permitted,
    multiset,
    permits,
    permitted_database,
    raising_statement,
    raising_statements,
    statements,
)
from query_gateway.sql import narrow_query, validate_query
from query_gateway.sql.rows import jsonable


@pytest.fixture
async def db_b(postgres_url: str) -> AsyncIterator[asyncpg.Connection]:
    async with permitted_database(postgres_url) as conn:
        yield conn


@settings(
    max_examples=50,
    deadline=None,
    derandomize=bool(os.environ.get("CI")),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(sql=statements(), permit=permits)
# no value of the sites allow-list converts: a deny, so not even the count of a cross join
@example(
    sql="SELECT count(*) AS n FROM ops.sites s CROSS JOIN grid.meters m",
    permit=Permit(pods=("pod-1",), orgs=("org-a",), sites=("not-a-uuid",)),
)
@example(
    sql="SELECT count(*) AS n FROM ops.sites s CROSS JOIN grid.meters m",
    permit=Permit(pods=("pod-1",), orgs=("org-a",), sites=()),
)
# other spellings of a permitted uuid match its row; a malformed neighbour is dropped
@example(
    sql="SELECT s.name, s.site_uuid FROM ops.sites s WHERE s.site_uuid = '5b7e7f5c-1111-4a4a-9b9b-000000000001' OR s.pod = 'pod-2'",
    permit=Permit(pods=(), orgs=(), sites=(SITE_UUIDS[0].upper(), "{" + SITE_UUIDS[1] + "}", "42")),
)
async def test_rewrite_matches_a_database_holding_only_permitted_rows(
    db: Db, db_b: asyncpg.Connection, sql: str, permit: Permit
) -> None:
    validated = validate_query(sql, CATALOGUE)  # every generated statement is a valid one
    page = await db.query(sql, permit.plans())
    got = multiset([tuple(item.values()) for item in page.items])
    if permit.denies(validated.dataset_ids):
        # RF-05: a deny puts FALSE into every SELECT, the outer page and count included
        assert (got, page.total) == ([], 0), sql
        return
    await load_permitted(db_b, permit)
    direct = await db_b.fetch(sql)
    expected = multiset([tuple(jsonable(v) for v in r.values()) for r in direct])
    assert got == expected, sql
    assert page.total == len(expected)


@settings(
    max_examples=60,
    deadline=None,
    derandomize=bool(os.environ.get("CI")),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(raising=raising_statements(), permit=permits)
# the aimed-at row (pod-2, value 14: id 2) is forbidden: B holds nothing to raise on
@example(
    raising=raising_statement("where", RAISE, "pod-2", 14),
    permit=Permit(pods=("pod-1", "pod-3", "pod-4"), orgs=("org-a", "org-b"), sites=None),
)
# the aimed-at row (pod-3, value 1: id 10) is permitted and B raises on it, but the narrowed
# statement's semi-join stops at id 2, the first reading of pod-3, and never reads id 10: rows
@example(
    raising=raising_statement("in subquery", RAISE, "pod-3", 1),
    permit=Permit(pods=("pod-3",), orgs=("org-a",), sites=None),
)
@example(
    raising=raising_statement("in subquery", CAST_RAISE, "pod-2", 4),
    permit=Permit(pods=("pod-2",), orgs=("org-a",), sites=None),
)
async def test_raising_predicates_answer_as_a_database_holding_only_permitted_rows(
    db: Db, db_b: asyncpg.Connection, raising: Raising, permit: Permit
) -> None:
    """Issue 19: the same answer every time, repeated past the generic plan. Where B serves rows,
    exactly those: an error there would come from a forbidden row B does not hold (a leak).
    Where B errs, the aimed-at row is permitted, and an error or rows are both right: SQL does not
    say on which rows a predicate is evaluated, and the narrowed statement's plan may never read
    that row (a semi-join stops at its first match). Rows, then, must be B's for both quiet
    twins of the statement (the guard answering NULL, then TRUE, on that row instead of raising):
    the guard's answer on a row never evaluated cannot change them."""
    sql = raising.sql
    validated = validate_query(sql, CATALOGUE)
    outcomes = set()
    for _ in range(8):
        try:
            page = await db.query(sql, permit.plans())
            outcomes.add(("rows", tuple(multiset([tuple(item.values()) for item in page.items]))))
        except ServiceError as err:
            outcomes.add(("error", err.code))
    assert len(outcomes) == 1, (sql, outcomes)  # the same answer every time
    [got] = outcomes
    if permit.denies(validated.dataset_ids):
        assert got == ("rows", ()), sql  # FALSE everywhere: nothing is read, so nothing raises
        return
    await load_permitted(db_b, permit)

    async def on_b(statement: str) -> tuple[object, ...]:
        rows = await db_b.fetch(statement)
        return ("rows", tuple(multiset([tuple(jsonable(v) for v in r.values()) for r in rows])))

    try:
        expected = await on_b(sql)
    except asyncpg.DataError:
        quiet = [await on_b(twin) for twin in raising.twins]
        event("error" if got[0] == "error" else "error on B, rows on A")
        assert got == ("error", "query_failed") or all(got == q for q in quiet), (sql, got, quiet)
        return
    event("rows")
    assert got == expected, sql


EXPOSURE = Catalogue.model_validate({"datasets": [*CATALOGUE.model_dump()["datasets"], *DATASETS[:1]]})
EXPOSURE_STATEMENTS = [t.format(c=c) for t in POSITIONS.values() for c in EXPOSED] + list(WHOLE.values())


@pytest.fixture
async def db_x(postgres_url: str) -> AsyncIterator[asyncpg.Connection]:
    async with exposed_database(postgres_url) as conn:
        yield conn


@settings(
    max_examples=60,
    deadline=None,
    derandomize=bool(os.environ.get("CI")),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(sql=st.sampled_from(EXPOSURE_STATEMENTS), permit=permits)
async def test_exposed_columns_answer_as_a_database_holding_only_the_exposed_columns(
    db: Db, db_x: asyncpg.Connection, sql: str, permit: Permit
) -> None:
    """Issue 15: narrow.readings exposes id and value and is narrowed by pod and org, the two
    columns it does not expose; B holds only (id, value) of the permitted rows."""
    validated = validate_query(sql, EXPOSURE)
    narrowed = narrow_query(validated, EXPOSURE, {"narrow.readings": permit.plans()["readings"]}, db.columns)
    page = await db.executor.run(narrowed, offset=0, limit=10_000, skip_count=False)
    got = multiset([tuple(item.values()) for item in page.items])
    event("deny" if permit.denies(("readings",)) else "rows" if got else "empty")
    if permit.denies(("readings",)):
        assert (got, page.total) == ([], 0), sql
        return
    await load_exposed(db_x, permit)
    expected = multiset([tuple(jsonable(v) for v in r.values()) for r in await db_x.fetch(sql)])
    assert got == expected, sql
