# ruff: noqa: E501 - SQL test data reads best on one line
"""Issue 30: the barrier only where a caller qual can leak, and the order carried where it fences
(docs/row-filters.md, "Fenced only where a caller qual can leak"). Against a real PostgreSQL: the
leakproof operators are read from its catalogs, every statement's rows are compared with the
same statement narrowed with every barrier kept, and both verifiers refuse an unfenced narrowing
under a qual that may leak."""

from __future__ import annotations

import pytest

from dataplane_service_kit.errors import ServiceError
from dataplane_testing.sqlgw import CATALOGUE, Db, multiset, pods
from query_gateway.sql import narrow_query, validate_query
from query_gateway.sql.leakproof import LeakproofOperators, load_leakproof_operators
from query_gateway.sql.model import NarrowedQuery
from query_gateway.sql.pg_verify import check_narrowed, refusal_reason, statement_leakproof
from query_gateway.sql.verify import Expected, verify_narrowed

# every qual leakproof for PostgreSQL's own operators on the exact operand types
UNFENCED = {
    "no qual": "SELECT pod, count(*) AS n, avg(value) AS mean FROM readings GROUP BY pod ORDER BY pod",
    "no qual, ordered page": "SELECT id, value FROM readings ORDER BY id",
    "text equality": "SELECT id FROM readings WHERE pod = 'pod-1'",
    "integer range": "SELECT id FROM readings WHERE value > 3 AND value <= 20",
    "between and in": "SELECT id FROM readings WHERE value BETWEEN 1 AND 9 AND pod IN ('pod-1', 'pod-3')",
    "not, or, is null": "SELECT id FROM readings WHERE NOT (pod <> 'pod-1') OR org IS NULL",
    "a derived table without qual": "SELECT s.pod FROM (SELECT pod FROM readings) s",
}
# some qual is not leakproof, or not typed exactly: every filtered narrowing keeps its barrier
FENCED = {
    "arithmetic": "SELECT id FROM readings WHERE value / 2 > 1",
    "a function": "SELECT id FROM readings WHERE lower(pod) = 'pod-1'",
    "a numeric literal against an integer": "SELECT id FROM readings WHERE value > 1.5",
    "a cast": "SELECT id FROM readings WHERE value::text = '3'",
    "having": "SELECT pod FROM readings GROUP BY pod HAVING count(*) > 1",
    "a subquery in a qual": "SELECT id FROM readings WHERE pod IN (SELECT pod FROM grid.meters)",
    "using": "SELECT id FROM readings JOIN grid.meters USING (pod)",
    "a qual above a derived table": "SELECT s.pod FROM (SELECT pod FROM readings) s WHERE s.pod = 'pod-1'",
    "a qual in a CTE's reader": "WITH c AS (SELECT * FROM readings) SELECT id FROM c WHERE c.value = 3",
    "a join on arithmetic": "SELECT r.id FROM readings r JOIN grid.meters m ON m.pod = r.pod AND r.value / 1 = 3",
    # leakproof, but two table reads: each side keeps its barrier and is planned alone
    "a join on equal keys": "SELECT r.id, m.kind FROM readings r JOIN grid.meters m ON m.pod = r.pod WHERE m.kind = 'k1'",
    "a scalar subquery beside": "SELECT r.id, (SELECT count(*) FROM grid.meters) AS n FROM readings r WHERE r.pod = 'pod-1'",
}
PLANS = pods("pod-1", "pod-3")


@pytest.fixture
async def operators(db: Db) -> LeakproofOperators:
    return await load_leakproof_operators(db.pool)


def _narrow(db: Db, sql: str, operators: LeakproofOperators) -> NarrowedQuery:
    narrowed = narrow_query(validate_query(sql, CATALOGUE), CATALOGUE, PLANS, db.columns, leakproof=operators)
    check_narrowed(narrowed)  # PostgreSQL's reading has the last word, here as in the gateway
    return narrowed


async def _rows(db: Db, narrowed: NarrowedQuery) -> object:
    page = await db.executor.run(narrowed, offset=0, limit=1000, skip_count=True)
    return multiset([tuple(sorted(row.items())) for row in page.items])


async def test_rf04_the_leakproof_operators_are_read_from_the_database(
    operators: LeakproofOperators, db: Db
) -> None:
    """Never assumed: the set is what pg_proc marks; text and integer comparisons are leakproof in
    PostgreSQL, numeric ones are not (they can raise), nor is any non-comparison operator."""
    async with db.pool.acquire() as conn:
        texteq = await conn.fetchval("SELECT proleakproof FROM pg_proc WHERE proname = 'texteq'")
        numeric_eq = await conn.fetchval("SELECT proleakproof FROM pg_proc WHERE proname = 'numeric_eq'")
    assert (("=", "text", "text") in operators) is texteq is True
    assert (("=", "numeric", "numeric") in operators) is numeric_eq is False
    assert ("<", "integer", "integer") in operators
    assert {op for op, _, _ in operators} <= {"=", "<>", "<", ">", "<=", ">="}


@pytest.mark.parametrize("name", UNFENCED)
async def test_rf04_a_statement_whose_every_qual_is_leakproof_runs_unfenced_with_the_same_rows(
    db: Db, operators: LeakproofOperators, name: str
) -> None:
    sql = UNFENCED[name]
    unfenced = _narrow(db, sql, operators)
    fenced = _narrow(db, sql, frozenset())
    assert "OFFSET 0" not in unfenced.sql
    assert fenced.sql.count("OFFSET 0") == fenced.sql.count("AS _dp_rf") >= 1
    assert unfenced.sql.count('_dp_rf."pod" = ANY(') == fenced.sql.count('_dp_rf."pod" = ANY(')
    assert await _rows(db, unfenced) == await _rows(db, fenced)


@pytest.mark.parametrize("name", FENCED)
async def test_rf04_a_statement_with_a_qual_that_may_leak_keeps_every_barrier(
    db: Db, operators: LeakproofOperators, name: str
) -> None:
    narrowed = _narrow(db, FENCED[name], operators)
    reads = narrowed.sql.count("AS _dp_rf")
    assert reads >= 1
    assert narrowed.sql.count("OFFSET 0") == reads


def test_rf04_without_the_operators_every_filtered_narrowing_is_fenced(db: Db) -> None:
    narrowed = _narrow(db, UNFENCED["text equality"], frozenset())
    assert narrowed.sql.count("OFFSET 0") == 1


async def test_rf04_where_it_fences_the_callers_order_is_carried_inside(
    db: Db, operators: LeakproofOperators
) -> None:
    """Grouping and ordering on the reference's own plain columns go inside the barrier, after the
    filter, so an index on them can feed the caller's GroupAggregate; the rows are the same."""
    sql = "SELECT pod, count(*) AS n FROM readings WHERE value / 1 >= 0 GROUP BY pod ORDER BY pod DESC"
    narrowed = _narrow(db, sql, operators)
    assert 'ORDER BY _dp_rf."pod" DESC OFFSET 0' in narrowed.sql
    grouped = _narrow(
        db, "SELECT pod, count(*) AS n FROM readings WHERE value / 1 >= 0 GROUP BY pod ORDER BY n", operators
    )
    assert (
        'ORDER BY _dp_rf."pod" OFFSET 0' in grouped.sql
    )  # the ORDER BY is an aggregate: the GROUP BY's keys
    plain = narrow_query(validate_query(sql, CATALOGUE), CATALOGUE, PLANS, db.columns)
    assert await _rows(db, narrowed) == await _rows(db, plain)
    page = await db.executor.run(narrowed, offset=0, limit=10, skip_count=True)
    assert [r["pod"] for r in page.items] == ["pod-3", "pod-1"]


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT r.pod FROM readings r JOIN grid.meters m ON m.pod = r.pod WHERE r.value / 1 > 0 ORDER BY r.pod",  # a join
        "SELECT value AS pod FROM readings WHERE value / 1 > 0 ORDER BY pod",  # an output name
        "SELECT pod FROM readings WHERE value / 1 > 0 ORDER BY lower(pod)",  # an expression
        "SELECT pod FROM readings WHERE value / 1 > 0 ORDER BY 1",  # a position
    ],
)
def test_rf04_an_order_that_is_not_the_references_own_columns_is_not_carried(
    db: Db, operators: LeakproofOperators, sql: str
) -> None:
    narrowed = _narrow(db, sql, operators)
    assert "ORDER BY _dp_rf" not in narrowed.sql
    assert narrowed.sql.count("OFFSET 0") == narrowed.sql.count("AS _dp_rf")


def test_rf04_postgresql_refuses_an_unfenced_narrowing_under_a_qual_that_may_leak(
    db: Db, operators: LeakproofOperators
) -> None:
    """The rewrite's decision is not taken on trust: pg_verify judges PostgreSQL's tree again."""
    fenced = _narrow(db, FENCED["arithmetic"], operators)
    stripped = fenced.sql.replace(" OFFSET 0", "")
    fences = tuple((t, text.replace(" OFFSET 0", "")) for t, text in fenced.fences)
    why = refusal_reason(stripped, fences, fenced.fence_types, operators)
    assert why == "a narrowing without its barrier under a qual that may leak"
    # the same stripping of a leakproof statement passes, and only with the database's operators
    ok = _narrow(db, UNFENCED["text equality"], operators)
    assert refusal_reason(ok.sql, ok.fences, ok.fence_types, operators) is None
    assert refusal_reason(ok.sql, ok.fences, ok.fence_types, frozenset()) is not None
    assert refusal_reason(ok.sql, ok.fences) is not None  # no column types: nothing is typed


def test_rf04_a_qual_on_a_masked_column_is_never_leakproof(db: Db, operators: LeakproofOperators) -> None:
    """Pulled up, a masked column is its expression (a keyed hash): the caller's qual would run it
    on rows the filter rejects, whatever the operator."""
    pred = '_dp_rf."pod" = ANY(CAST($1 AS TEXT[]))'
    fence = f'SELECT _dp_rf."id", encode(sha256(CAST(_dp_rf."org" AS TEXT)::bytea), \'hex\') AS "org" FROM public.readings AS _dp_rf WHERE {pred}'
    types = (("public.readings", tuple(db.columns["public.readings"].items())),)
    plain = f"SELECT r.id FROM ({fence}) AS r WHERE r.id = 3"
    masked = f"SELECT r.id FROM ({fence}) AS r WHERE r.org = 'x'"
    assert statement_leakproof(plain, [("public.readings", fence)], types, operators)
    assert not statement_leakproof(masked, [("public.readings", fence)], types, operators)


def test_rf04_the_sqlglot_verifier_takes_an_unfenced_or_ordered_narrowing_only_as_told() -> None:
    pred = '_dp_rf."pod" = ANY(CAST($1 AS TEXT[]))'
    expected: Expected = {("public", "readings"): {(pred, "*")}}
    unfenced = f"SELECT * FROM (SELECT * FROM public.readings AS _dp_rf WHERE {pred}) AS r"
    verify_narrowed(unfenced, expected, denied=False, n_params=1, unfenced=True)
    with pytest.raises(ServiceError):
        verify_narrowed(unfenced, expected, denied=False, n_params=1)
    ordered = f'SELECT * FROM (SELECT * FROM public.readings AS _dp_rf WHERE {pred} ORDER BY _dp_rf."pod" OFFSET 0) AS r'
    orders = frozenset({(("public", "readings"), 'ORDER BY _dp_rf."pod"')})
    verify_narrowed(ordered, expected, denied=False, n_params=1, orders=orders)
    with pytest.raises(ServiceError):  # an order the rewrite did not put there
        verify_narrowed(ordered, expected, denied=False, n_params=1)
    outside = ordered.replace(" OFFSET 0", "")
    with pytest.raises(ServiceError):  # an order without the barrier
        verify_narrowed(outside, expected, denied=False, n_params=1, unfenced=True, orders=orders)
    by_expression = ordered.replace('ORDER BY _dp_rf."pod"', 'ORDER BY lower(_dp_rf."pod")')
    with pytest.raises(ServiceError):
        verify_narrowed(
            by_expression, expected, denied=False, n_params=1,
            orders=frozenset({(("public", "readings"), 'ORDER BY LOWER(_dp_rf."pod")')}),
        )  # fmt: skip
