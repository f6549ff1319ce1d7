# ruff: noqa: E501 - SQL test data reads best on one line
"""QE-12: PostgreSQL's grammar has the last word (docs/gateway.md). The caller's statement is read
by PostgreSQL's own parser too, and refused where the two parsers disagree; the narrowed statement
must, in PostgreSQL's tree, read only the rewrite's narrowings and call only allowlisted functions.

The differential test reads every statement of the gateway's test corpus (each SQL string under
tests/query_gateway) and generated ones with PostgreSQL's parser through pglast's own node classes
— not the JSON walk the gateway uses — and asserts that no statement PostgreSQL reads differently
from what the gateway resolved (other relations, a function outside the allowlist, an SQL-value
function) is served."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pglast
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pglast.enums.primnodes import SQLValueFunctionOp

from dataplane_contracts.catalogue import Catalogue
from dataplane_contracts.plans import Plan
from dataplane_service_kit.errors import ServiceError
from dataplane_testing.sqlgw import CATALOGUE, Db, allow_all, pods
from query_gateway.sql import ValidatedQuery, narrow_query, rules, validate_query
from query_gateway.sql.pg_verify import DISAGREEMENT, check_narrowed, check_original, refusal_reason

GATEWAY_TESTS = Path(__file__).resolve().parents[1]
PRED = '_dp_rf."pod" = ANY(CAST($1 AS TEXT[]))'
FENCE = f"SELECT * FROM public.readings AS _dp_rf WHERE {PRED} OFFSET 0"
FENCES = (("public.readings", FENCE),)
GOOD = f"SELECT * FROM ({FENCE}) AS r"


def served(sql: str, catalogue: Catalogue = CATALOGUE) -> ValidatedQuery:
    """What the gateway's validate step answers: sqlglot's validation, then PostgreSQL's reading."""
    q = validate_query(sql, catalogue)
    check_original(q)
    return q


def refusal(sql: str, catalogue: Catalogue = CATALOGUE) -> ServiceError:
    with pytest.raises(ServiceError) as err:
        served(sql, catalogue)
    return err.value


# ---------------------------------------------------------------------- the statements of issue 34
def test_qe12_one_quoted_identifier_holding_a_dot_is_no_schema_qualified_dataset() -> None:
    dotted = Catalogue.model_validate(
        {"datasets": [{"id": "rtschema.rt_other", "table": "public.readings", "row_filters": {}}]}
    )
    assert served("SELECT * FROM rtschema.rt_other", dotted).dataset_ids == ("rtschema.rt_other",)
    err = refusal('SELECT * FROM "rtschema.rt_other"', dotted)
    assert (err.code, err.detail) == ("sql_refused", DISAGREEMENT)
    assert refusal('SELECT * FROM "grid.meters"').detail == DISAGREEMENT
    assert served('SELECT * FROM "grid"."meters"').dataset_ids == ("grid.meters",)


@pytest.mark.parametrize("word", ["system_user", "SYSTEM_USER"])
def test_qe12_system_user_is_an_sql_value_function_not_a_column(word: str) -> None:
    validate_query(f"SELECT {word} FROM readings", CATALOGUE)  # sqlglot reads a column
    err = refusal(f"SELECT {word} FROM readings")
    assert (err.code, err.detail) == ("sql_refused", DISAGREEMENT)


def test_qe12_a_syntax_refusal_names_a_position_never_a_token() -> None:
    with pytest.raises(ServiceError) as err:
        validate_query("SELECT * FROM ONLY (readings)", CATALOGUE)
    assert err.value.code == "sql_refused"
    assert err.value.detail == "Invalid SQL syntax at line 1, column 20"


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT ifnull(pod, 'x') FROM readings",  # sqlglot reads COALESCE; PostgreSQL calls ifnull
        'SELECT "LOWER"(pod) FROM readings',  # a quoted name keeps its case: another function
        "SELECT * FROM readings WHERE pod = 'x' AND localtime IS NOT NULL",
    ],
)
def test_qe12_a_function_postgresql_would_call_and_the_allowlist_never_saw_is_refused(sql: str) -> None:
    with pytest.raises(ServiceError) as err:
        served(sql)
    assert err.value.code == "sql_refused"


@pytest.mark.parametrize(
    "sql",
    [
        'SELECT * FROM "grid"."meters" JOIN "readings" r ON TRUE',
        "SELECT * FROM readings WHERE value BETWEEN SYMMETRIC 3 AND 1",
        "SELECT trim(pod), substring(pod FROM 1 FOR 2), extract(year FROM now()), current_date FROM readings",
        "WITH readings AS (SELECT * FROM readings) SELECT pod FROM readings",
    ],
)
def test_qe12_a_statement_both_parsers_read_alike_is_served(sql: str) -> None:
    assert served(sql).dataset_ids


# ---------------------------------------------------------------------- the narrowed statement
BAD_NARROWED = {
    "bare table": "SELECT * FROM public.readings",
    "bare table in a cte": f"WITH x AS (SELECT * FROM public.readings) SELECT * FROM ({FENCE}) AS y",
    "bare table in a scalar subquery": f"SELECT (SELECT count(*) FROM public.readings) AS n FROM ({FENCE}) AS y",
    "narrowing without predicate": "SELECT * FROM (SELECT * FROM public.readings AS _dp_rf) AS r",
    "narrowing with a widened predicate": f"SELECT * FROM (SELECT * FROM public.readings AS _dp_rf WHERE {PRED} OR TRUE OFFSET 0) AS r",
    "narrowing without the barrier": f"SELECT * FROM (SELECT * FROM public.readings AS _dp_rf WHERE {PRED}) AS r",
    "barrier of another offset": f"SELECT * FROM (SELECT * FROM public.readings AS _dp_rf WHERE {PRED} OFFSET 1) AS r",
    "narrowing of another table": f"SELECT * FROM (SELECT * FROM public.meters AS _dp_rf WHERE {PRED} OFFSET 0) AS r",
    "narrowing of a dotted identifier": f'SELECT * FROM (SELECT * FROM "public.readings" AS _dp_rf WHERE {PRED} OFFSET 0) AS r',
    "ONLY": f"SELECT * FROM (SELECT * FROM ONLY public.readings AS _dp_rf WHERE {PRED} OFFSET 0) AS r",
    "stray parameter": f"SELECT $2 AS x FROM ({FENCE}) AS y",
    "sql-value function": f"SELECT current_user AS u FROM ({FENCE}) AS y",
    "system_user": f"SELECT system_user AS u FROM ({FENCE}) AS y",
    "function outside the allowlist": f"SELECT md5(r.pod) FROM ({FENCE}) AS r",
    "function by a qualified name": f"SELECT pg_catalog.lower(r.pod) FROM ({FENCE}) AS r",
    "unbounded generator": f"SELECT generate_series(1, 3) FROM ({FENCE}) AS r",
    "table function": f"SELECT * FROM ({FENCE}) AS r, generate_series(1, 3) AS g",
    "reg cast": f"SELECT 'pg_authid'::regclass FROM ({FENCE}) AS r",
    "set operation": f"SELECT * FROM ({FENCE}) AS r UNION SELECT * FROM ({FENCE}) AS s",
    "locking": f"SELECT * FROM ({FENCE}) AS r FOR UPDATE",
    "operator outside the list": f"SELECT r.pod || 'x' FROM ({FENCE}) AS r",
    "two statements": f"{GOOD}; SELECT 1",
    "not a select": "DELETE FROM public.readings",
    "not parseable": "SELECT * FROM (",
}


def test_qe12_the_narrowed_statement_passes_as_the_rewrite_built_it() -> None:
    assert refusal_reason(GOOD, FENCES) is None
    assert refusal_reason(f"WITH c AS (SELECT r.pod FROM ({FENCE}) AS r) SELECT c.pod FROM c", FENCES) is None


@pytest.mark.parametrize("case", BAD_NARROWED)
def test_qe12_the_narrowed_statement_is_refused_unless_postgresql_reads_only_narrowings(case: str) -> None:
    assert refusal_reason(BAD_NARROWED[case], FENCES) is not None


def test_qe12_a_narrowing_must_read_the_catalogue_table_as_postgresql_reads_it() -> None:
    # the catalogue's `energy."Sites"` keeps its case; `energy.sites` is another relation
    fence = f"SELECT * FROM energy.sites AS _dp_rf WHERE {PRED} OFFSET 0"
    assert refusal_reason(f"SELECT * FROM ({fence}) AS s", (('energy."Sites"', fence),)) is not None
    quoted = f'SELECT * FROM energy."Sites" AS _dp_rf WHERE {PRED} OFFSET 0'
    assert refusal_reason(f"SELECT * FROM ({quoted}) AS s", (('energy."Sites"', quoted),)) is None


def test_qe12_a_cte_is_a_cte_only_where_postgresql_sees_it() -> None:
    # a CTE name used before its WITH's scope (in a sibling declared earlier) reads the table
    sql = f"WITH a AS (SELECT * FROM b), b AS (SELECT r.pod FROM ({FENCE}) AS r) SELECT * FROM a"
    assert refusal_reason(sql, FENCES) is not None


def test_qe12_the_refusal_of_a_narrowed_statement_is_fixed() -> None:
    q = validate_query("SELECT * FROM readings", CATALOGUE)
    columns = {"public.readings": {"id": "integer", "pod": "text", "value": "integer", "org": "text"}}
    narrowed = narrow_query(q, CATALOGUE, pods("pod-1"), columns)
    check_narrowed(narrowed)  # as built
    forged = dataclasses.replace(narrowed, sql=narrowed.sql.replace("public.readings", "public.secrets"))
    with pytest.raises(ServiceError) as err:
        check_narrowed(forged)
    assert err.value.code == "sql_refused"
    assert "secrets" not in err.value.detail
    # valid alone, but a trailing comment swallows the executor's `) AS q LIMIT … OFFSET …`
    with pytest.raises(ServiceError):
        check_narrowed(dataclasses.replace(narrowed, sql=narrowed.sql + " --"))


# ---------------------------------------------------------------------- the differential test
_SQLISH = re.compile(r"^\s*\(?\s*(SELECT|WITH|VALUES|TABLE)\b", re.I)


def _strings(value: object) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def corpus() -> list[str]:
    """Every SQL string of the gateway's tests: the string constants of its modules (implicit
    concatenations joined) and the strings of its vector files."""
    found: set[str] = set()
    for path in sorted(GATEWAY_TESTS.rglob("*")):
        if path.suffix == ".py":
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    found.add(node.value)
        elif path.suffix == ".json":
            found.update(_strings(json.loads(path.read_text(encoding="utf-8"))))
    return sorted(s for s in found if _SQLISH.match(s) and "\x00" not in s)


CORPUS = corpus()


# pieces that read differently in the two grammars, or that sqlglot maps onto another spelling
_RELATIONS = [
    "readings",
    "READINGS",
    '"readings"',
    '"READINGS"',
    'U&"readings"',
    'U&"r\\0065adings"',
    "grid.meters",
    '"grid.meters"',
    '"grid"."meters"',
    'GRID."METERS"',
    "ops.sites",
    '"ops.sites"',
    "public.readings",
    '"public".readings',
]
_VALUES = [
    "pod",
    '"pod"',
    "system_user",
    "current_user",
    "session_user",
    "user",
    "current_role",
    "current_catalog",
    "current_schema",
    "localtime",
    "localtimestamp",
    "current_time",
    "current_date",
    "current_timestamp",
    "now()",
    "lower(pod)",
    '"lower"(pod)',
    "LOWER(pod)",
    '"LOWER"(pod)',
    "ifnull(pod, 'x')",
    "coalesce(pod, 'x')",
    "nullif(pod, 'x')",
    "trim(pod)",
    "btrim(pod)",
    "substring(pod from 1 for 2)",
    "position('a' in pod)",
    "overlay(pod placing 'x' from 1)",
    "extract(year from now())",
    "E'a\\'b'",
    "$$x$$",
    "$q$ y $q$",
    "U&'\\0041'",
    "'a' || 'b'",
    "value + 1",
    "value % 2",
    "pod::text",
    "pod::regclass",
    "pod::name",
    "pod ~ 'x'",
    "pod AT TIME ZONE 'utc'",
    "collation for (pod)",
    'pod COLLATE "C"',
    "array[1]",
    "(pod)",
    "x'1f'",
    "b'01'",
    "1e3",
    "0x1f",
    "1_000",
]
_WHERES = [
    "",
    "WHERE value > 1",
    "WHERE pod = 'pod-1'",
    "WHERE pod IS DISTINCT FROM 'x'",
    "WHERE pod LIKE 'p%'",
    "WHERE value BETWEEN SYMMETRIC 3 AND 1",
    "WHERE pod = E'\\x27'",
    "WHERE pod = $$a'b$$",
]

generated = st.builds(
    lambda v, r, w, alias: f"SELECT {v} AS x FROM {r}{alias} {w}".strip(),
    st.sampled_from(_VALUES),
    st.sampled_from(_RELATIONS),
    st.sampled_from(_WHERES),
    st.sampled_from(["", " t", " AS t"]),
)


def _pg_reading(sql: str) -> tuple[list[tuple[str, ...]], set[str], set[str]]:
    """PostgreSQL's reading, through pglast's node classes: the relations read (CTE names left
    out), the functions called by name, the SQL-value functions."""
    relations: list[tuple[str, ...]] = []
    functions: set[str] = set()
    values: set[str] = set()

    def visit(node: object, ctes: frozenset[str]) -> None:
        if isinstance(node, tuple | list):
            for item in node:
                visit(item, ctes)
            return
        if not isinstance(node, pglast.ast.Node):
            return
        if isinstance(node, pglast.ast.SelectStmt) and node.withClause is not None:
            # a plain WITH: each CTE sees the ones before it, the body sees them all
            for cte in node.withClause.ctes or ():
                visit(cte.ctequery, ctes)
                ctes = ctes | {cte.ctename}
        elif isinstance(node, pglast.ast.RangeVar):
            parts = tuple(p for p in (node.catalogname, node.schemaname, node.relname) if p)
            if not (len(parts) == 1 and parts[0] in ctes):
                relations.append(parts)
        elif isinstance(node, pglast.ast.FuncCall):
            functions.add(".".join(n.sval for n in node.funcname))
        elif isinstance(node, pglast.ast.SQLValueFunction):
            values.add(SQLValueFunctionOp(node.op).name)
        for slot in node.__slots__:
            if slot != "withClause":
                visit(getattr(node, slot, None), ctes)

    visit(pglast.parse_sql(sql), frozenset())
    return relations, functions, values


_SQL_SYNTAX = {
    "pg_catalog.btrim": "trim",
    "pg_catalog.ltrim": "ltrim",
    "pg_catalog.rtrim": "rtrim",
    "pg_catalog.substring": "substring",
    "pg_catalog.extract": "extract",
}
_ALLOWED_VALUES = {"SVFOP_CURRENT_DATE", "SVFOP_CURRENT_TIMESTAMP", "SVFOP_CURRENT_TIMESTAMP_N"}
_CALLABLE = rules.FUNCTION_ALLOWLIST | {"count", "sum", "min", "max", "avg", "array_agg"}


def _resolves(parts: tuple[str, ...], dataset_ids: tuple[str, ...], catalogue: Catalogue) -> bool:
    """docs/gateway.md, "Dataset resolution", on PostgreSQL's parts: the id they spell, or for two
    parts the one id ending in them; a part holding a dot is one identifier to PostgreSQL."""
    if any("." in p for p in parts):
        return False
    ref = ".".join(parts)
    ids = [d.id for d in catalogue.datasets]
    found = [i for i in ids if i == ref] or (
        [i for i in ids if i.endswith("." + ref)] if len(parts) == 2 else []
    )
    return len(found) == 1 and found[0] in dataset_ids


def assert_served_as_postgresql_reads_it(sql: str, catalogue: Catalogue) -> bool:
    """True when the gateway serves `sql` (validation and PostgreSQL's reading pass); then what
    PostgreSQL reads must be what the gateway resolved and allows."""
    try:
        q = served(sql, catalogue)
    except ServiceError:
        return False
    relations, functions, values = _pg_reading(sql.rstrip().rstrip(";"))
    assert all(_resolves(parts, q.dataset_ids, catalogue) for parts in relations), sql
    resolved = {d for parts in relations for d in q.dataset_ids if _resolves(parts, (d,), catalogue)}
    assert resolved == set(q.dataset_ids), sql
    assert {_SQL_SYNTAX.get(f, f) for f in functions} <= _CALLABLE, sql
    assert values <= _ALLOWED_VALUES, sql
    return True


def test_qe12_the_corpus_is_the_whole_test_suite() -> None:
    # a collector that finds nothing would make the differential test pass vacuously
    assert len(CORPUS) > 200
    assert 'SELECT * FROM "grid.meters"' in CORPUS  # this module's own statements among them


def test_qe12_no_statement_of_the_corpus_that_postgresql_reads_differently_is_served() -> None:
    catalogues = [
        CATALOGUE,
        _yaml(GATEWAY_TESTS / "catalogue.yaml"),
        _yaml(GATEWAY_TESTS / "oracle_catalogue.yaml"),
    ]
    served_count = sum(assert_served_as_postgresql_reads_it(sql, cat) for sql in CORPUS for cat in catalogues)
    assert served_count > 100  # most of the corpus's accepted statements are still served


def _yaml(path: Path) -> Catalogue:
    return Catalogue.model_validate(yaml.safe_load(path.read_text(encoding="utf-8")))


@settings(
    max_examples=400,
    deadline=None,
    derandomize=bool(os.environ.get("CI")),
    suppress_health_check=[HealthCheck.too_slow],
)
@given(sql=generated)
def test_qe12_no_generated_statement_that_postgresql_reads_differently_is_served(sql: str) -> None:
    try:
        pglast.parse_sql(sql)
    except pglast.parser.ParseError:
        with pytest.raises(ServiceError):  # what PostgreSQL cannot parse is never served
            served(sql)
        return
    assert_served_as_postgresql_reads_it(sql, CATALOGUE)


async def test_qe12_every_served_statement_of_the_corpus_narrows_to_what_postgresql_verifies(db: Db) -> None:
    """On the real database's columns: each served statement of the corpus, narrowed under an
    allow-list, a deny and no filter, passes PostgreSQL's verification of the narrowed text, and
    PostgreSQL plans that exact text (EXPLAIN: nothing runs)."""
    planned = 0
    deny = {"readings": [Plan.deny()], "grid.meters": [], "ops.sites": []}
    async with db.pool.acquire() as conn:
        for sql in CORPUS:
            try:
                q = served(sql)
            except ServiceError:
                continue
            for plans in (allow_all(), pods("pod-1"), deny):
                try:
                    narrowed = narrow_query(q, CATALOGUE, plans, db.columns)
                except ServiceError:
                    continue  # a column the statement names that the tables lack, refused as before
                check_narrowed(narrowed)
                try:
                    await conn.fetchval(f"EXPLAIN {narrowed.sql}", *narrowed.params)
                except Exception:  # the caller's mistake, found by analysis (an unknown column, a type)
                    continue
                planned += 1
    assert planned > 50
