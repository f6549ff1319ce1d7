# ruff: noqa: E501 - SQL test data reads best on one line
"""Column exposure through the SQL pipeline (issue 15): validate → narrow → execute on database A
(every column, every row) against the same statement run verbatim on database B, which holds only
narrow.readings' two exposed columns of the permitted rows. A statement naming an exposed column
in any position must answer B's rows; naming an unexposed one (its row filter's own columns), one
that exists nowhere, or a case twin must be refused `column_not_exposed` with one and the same
answer, exactly where B, which has no such column, fails. Masks read as specified; the fence is
what the verifier proves; start-up refuses a `columns:` list naming a missing column."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest

from dataplane_contracts.catalogue import Catalogue
from dataplane_contracts.plans import Plan
from dataplane_service_kit.errors import ServiceError
from dataplane_testing.exposure import (
    DATASETS,
    EXPOSED,
    HIDDEN,
    MASK_KEY,
    MASKED,
    NARROW,
    POSITIONS,
    WHOLE,
    WHOLE_ROW_FUNCTIONS,
    exposed_database,
    load_exposed,
    masked_sites,
    pseudonym,
)
from dataplane_testing.sqlgw import CATALOGUE, Db, Permit, multiset
from query_gateway.sql import (
    CatalogueMismatch,
    NarrowedQuery,
    load_column_types,
    narrow_query,
    validate_query,
)
from query_gateway.sql.exposure import MaskKey
from query_gateway.sql.references import NOT_EXPOSED
from query_gateway.sql.rows import jsonable
from query_gateway.sql.verify import verify_narrowed

EXPOSURE = Catalogue.model_validate({"datasets": [*CATALOGUE.model_dump()["datasets"], *DATASETS]})
KEY = MaskKey.of(MASK_KEY)
PERMITS = {
    "two pods, one org": Permit(pods=("pod-1", "pod-3"), orgs=("org-a",), sites=None),
    "every pod and org": Permit(
        pods=("pod-1", "pod-2", "pod-3", "pod-4"), orgs=("org-a", "org-b"), sites=None
    ),
}


def plans(permit: Permit) -> dict[str, list[Plan]]:
    """narrow.readings narrowed by pod and org, the two columns it does not expose."""
    return {**{d.id: [] for d in CATALOGUE.datasets}, NARROW: permit.plans()["readings"], MASKED: []}


def narrow(db: Db, sql: str, permit: Permit, key: MaskKey | None = KEY) -> NarrowedQuery:
    return narrow_query(validate_query(sql, EXPOSURE), EXPOSURE, plans(permit), db.columns, key)


async def through_gateway(db: Db, sql: str, permit: Permit) -> tuple[object, ...]:
    try:
        page = await db.executor.run(narrow(db, sql, permit), offset=0, limit=10_000, skip_count=False)
    except ServiceError as err:
        return ("error", err.code, err.detail)
    return ("rows", tuple(multiset([tuple(item.values()) for item in page.items])))


async def on_b(b: asyncpg.Connection, sql: str) -> tuple[object, ...]:
    try:
        rows = await b.fetch(sql)
    except asyncpg.UndefinedColumnError:
        return ("no such column",)
    return ("rows", tuple(multiset([tuple(jsonable(v) for v in r.values()) for r in rows])))


@pytest.fixture
async def db_b(postgres_url: str) -> AsyncIterator[asyncpg.Connection]:
    async with exposed_database(postgres_url) as conn:
        yield conn


@pytest.mark.parametrize("permit", PERMITS)
@pytest.mark.parametrize("position", POSITIONS)
async def test_an_exposed_column_in_every_position_answers_as_a_database_holding_only_exposed_columns(
    db: Db, db_b: asyncpg.Connection, position: str, permit: str
) -> None:
    await load_exposed(db_b, PERMITS[permit])
    for column in EXPOSED:
        sql = POSITIONS[position].format(c=column)
        expected = await on_b(db_b, sql)
        assert expected[0] == "rows", (sql, expected)
        assert await through_gateway(db, sql, PERMITS[permit]) == expected, sql


@pytest.mark.parametrize("position", POSITIONS)
async def test_an_unexposed_or_missing_column_in_every_position_gets_one_refusal(
    db: Db, db_b: asyncpg.Connection, position: str
) -> None:
    """The same code and detail for the filter columns (which exist), a name no table has and a
    case twin of an exposed column; B, which has none of them, fails on each."""
    await load_exposed(db_b, PERMITS["every pod and org"])
    for column in HIDDEN:
        sql = POSITIONS[position].format(c=column)
        assert await on_b(db_b, sql) == ("no such column",), sql
        got = await through_gateway(db, sql, PERMITS["every pod and org"])
        assert got == ("error", "column_not_exposed", NOT_EXPOSED), sql
        # a deny answers the same: the refusal reads the statement and the exposure only
        denied = Permit(pods=(), orgs=("org-a",), sites=None)
        assert await through_gateway(db, sql, denied) == got, sql


@pytest.mark.parametrize("permit", PERMITS)
@pytest.mark.parametrize("statement", WHOLE)
async def test_stars_and_whole_row_references_show_only_exposed_columns(
    db: Db, db_b: asyncpg.Connection, statement: str, permit: str
) -> None:
    """`*`, `t.*` and whole rows expand to the fence's columns; the row filter on the unexposed
    pod and org still narrows (B holds only the permitted rows)."""
    await load_exposed(db_b, PERMITS[permit])
    sql = WHOLE[statement]
    expected = await on_b(db_b, sql)
    assert expected[0] == "rows" and expected[1], (sql, expected)
    assert await through_gateway(db, sql, PERMITS[permit]) == expected, sql
    if statement == "star":
        page = await db.executor.run(narrow(db, sql, PERMITS[permit]), offset=0, limit=1, skip_count=True)
        assert list(page.items[0]) == ["id", "value"]  # the table's order, not the list's


@pytest.mark.parametrize("sql", WHOLE_ROW_FUNCTIONS)
def test_whole_row_functions_and_attribute_notation_are_refused(db: Db, sql: str) -> None:
    with pytest.raises(ServiceError) as err:
        narrow(db, sql, PERMITS["every pod and org"])
    assert err.value.code == WHOLE_ROW_FUNCTIONS[sql]


def test_an_unrestricted_dataset_beside_keeps_its_columns(db: Db) -> None:
    """A name that is a column of another relation in scope is that relation's: `pod` of the
    meters in a statement that also reads narrow.readings."""
    sql = (
        "SELECT m.pod, r.id FROM narrow.readings r JOIN grid.meters m ON m.pod = 'pod-1' WHERE pod = 'pod-1'"
    )
    assert narrow(db, sql, PERMITS["every pod and org"]).sql.count("_dp_rf") >= 2


async def test_masks_read_as_null_and_as_a_keyed_pseudonym(db: Db) -> None:
    sql = "SELECT * FROM masked.sites ORDER BY site_id"
    page = await db.executor.run(
        narrow(db, sql, PERMITS["every pod and org"]), offset=0, limit=100, skip_count=True
    )
    assert page.items == masked_sites()
    # stable: the pseudonym finds its row, and joins with itself
    target = masked_sites()[1]["site_uuid"]
    sql = f"SELECT a.site_id FROM masked.sites a JOIN masked.sites b ON a.site_uuid = b.site_uuid WHERE a.site_uuid = '{target}'"
    page = await db.executor.run(
        narrow(db, sql, PERMITS["every pod and org"]), offset=0, limit=100, skip_count=True
    )
    assert page.items == [{"site_id": 2}]
    # a NULL mask keeps its column's type: text operators still apply, to NULL
    sql = "SELECT count(*) AS n FROM masked.sites WHERE lower(pod) IS NULL"
    page = await db.executor.run(
        narrow(db, sql, PERMITS["every pod and org"]), offset=0, limit=100, skip_count=True
    )
    assert page.items == [{"n": 4}]


async def test_the_pseudonym_is_keyed_per_deployment(db: Db) -> None:
    """Another key, another pseudonym, for a key longer than the hash's block too (RFC 2104)."""
    other = "another-deployment-" * 5
    sql = "SELECT site_uuid FROM masked.sites WHERE site_id = 1"
    narrowed = narrow(db, sql, PERMITS["every pod and org"], MaskKey.of(other))
    page = await db.executor.run(narrowed, offset=0, limit=10, skip_count=True)
    assert page.items == [{"site_uuid": pseudonym(masked_uuid(1), other)}]
    assert page.items[0]["site_uuid"] != pseudonym(masked_uuid(1))


def masked_uuid(site_id: int) -> str:
    from dataplane_testing.sqlgw import SITES

    return next(u for s, u, _, _ in SITES if s == site_id)


def test_the_fence_lists_exactly_the_exposure_and_binds_the_key_after_the_allow_lists(db: Db) -> None:
    narrowed = narrow(db, "SELECT r.id FROM narrow.readings r, masked.sites s", PERMITS["every pod and org"])
    assert '(SELECT _dp_rf."id", _dp_rf."value" FROM public.readings AS _dp_rf WHERE' in narrowed.sql
    assert (
        '(SELECT _dp_rf."site_id", ENCODE(SHA256(CAST($4 AS BYTEA) || SHA256(CAST($3 AS BYTEA) || '
        "CONVERT_TO(CAST(_dp_rf.\"site_uuid\" AS TEXT), 'UTF8'))), 'hex') AS \"site_uuid\", "
        'CAST(NULL AS TEXT) AS "pod", _dp_rf."name" FROM energy."Sites" AS _dp_rf WHERE TRUE)'
    ) in narrowed.sql
    assert narrowed.params[2:] == KEY.params and len(narrowed.params) == 4
    assert narrowed.param_labels[2:] == (
        "column mask key (HMAC inner pad)",
        "column mask key (HMAC outer pad)",
    )
    assert repr(KEY) == "MaskKey(<withheld>)" and repr(narrowed) == "NarrowedQuery(params=<4>, denied=False)"
    assert {e.dataset_id: e.as_json() for e in narrowed.exposure} == {
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


def test_a_denied_statement_binds_no_key(db: Db) -> None:
    denied = Permit(pods=(), orgs=(), sites=None)
    narrowed = narrow(db, "SELECT * FROM narrow.readings r, masked.sites s", denied)
    assert narrowed.denied and narrowed.params == () and "SHA256" not in narrowed.sql


def test_a_hash_mask_without_a_key_is_refused(db: Db) -> None:
    with pytest.raises(ServiceError) as err:
        narrow(db, "SELECT name FROM masked.sites", PERMITS["every pod and org"], key=None)
    assert err.value.code == "sql_refused" and "mask key" in err.value.detail
    narrow(db, "SELECT id FROM narrow.readings", PERMITS["every pod and org"], key=None)  # no hash: fine


def test_the_verifier_refuses_a_fence_other_than_the_exposure(db: Db) -> None:
    narrowed = narrow(db, "SELECT r.id FROM narrow.readings r", PERMITS["every pod and org"])
    pred = '_dp_rf."pod" = ANY(CAST($1 AS TEXT[])) AND _dp_rf."org" = ANY(CAST($2 AS TEXT[]))'
    fence = '_dp_rf."id", _dp_rf."value"'
    expected = {("public", "readings"): {(pred, fence)}}
    verify_narrowed(narrowed.sql, expected, denied=False, n_params=2)  # the baseline passes
    for wider in ("*", f'{fence}, _dp_rf."pod"', '_dp_rf."id", _dp_rf."pod" AS "value"', '_dp_rf."id"'):
        with pytest.raises(ServiceError) as err:
            verify_narrowed(narrowed.sql.replace(fence, wider, 1), expected, denied=False, n_params=2)
        assert err.value.code == "sql_refused", wider


async def test_gs09_startup_refuses_a_columns_list_naming_a_column_the_table_lacks(db: Db) -> None:
    entry = {**DATASETS[0], "columns": ["id", "value", "secret"]}
    with pytest.raises(
        CatalogueMismatch, match=r"narrow\.readings: columns lists secret, which table public\.readings lacks"
    ):
        await load_column_types(db.pool, Catalogue.model_validate({"datasets": [entry]}))
    await load_column_types(db.pool, Catalogue.model_validate({"datasets": [DATASETS[0]]}))


async def test_where_the_check_cannot_decide_postgresql_sees_only_the_fence(db: Db) -> None:
    """Beside a computed column PostgreSQL names itself (`count`), a bare name is left to
    PostgreSQL: the fence holds no unexposed column, so an unexposed and a missing name fail alike,
    and the statement naming the implicit `count` runs."""
    template = "SELECT {c} FROM narrow.readings r, (SELECT count(*) FROM narrow.readings) c"
    answers = {
        await through_gateway(db, template.format(c=c), PERMITS["every pod and org"]) for c in HIDDEN[:3]
    }
    assert answers == {("error", "query_failed", "Database query failed")}
    got = await through_gateway(db, template.format(c="count"), PERMITS["every pod and org"])
    assert got[0] == "rows" and len(got[1]) == 32


SCOPES = {
    # a LATERAL subquery sees the relations before it; a correlated one those around it
    "SELECT r.id, l.k FROM narrow.readings r, LATERAL (SELECT value AS k) l": None,
    "SELECT r.id FROM narrow.readings r WHERE r.id IN (SELECT m.kind FROM grid.meters m WHERE value > 1)": None,
    # a derived table and a CTE body do not see the relations of the query they are part of
    "SELECT d.k FROM grid.meters m, (SELECT kind AS k FROM narrow.readings) d": "column_not_exposed",
    "WITH x AS (SELECT kind AS k FROM narrow.readings) SELECT x.k FROM x, grid.meters": "column_not_exposed",
    # an output name serves ORDER BY and GROUP BY, not WHERE
    "SELECT value AS v FROM narrow.readings ORDER BY v": None,
    "SELECT value AS v FROM narrow.readings WHERE v > 1": "column_not_exposed",
    # a relation's name is its whole row; an implicit output name is left to PostgreSQL
    "SELECT r FROM narrow.readings r": None,
    "SELECT count(*) FROM narrow.readings ORDER BY count": None,
}


@pytest.mark.parametrize("sql", SCOPES)
def test_a_bare_name_is_judged_in_its_own_scope(db: Db, sql: str) -> None:
    if SCOPES[sql] is None:
        narrow(db, sql, PERMITS["every pod and org"])
        return
    with pytest.raises(ServiceError) as err:
        narrow(db, sql, PERMITS["every pod and org"])
    assert (err.value.code, err.value.detail) == (SCOPES[sql], NOT_EXPOSED)
