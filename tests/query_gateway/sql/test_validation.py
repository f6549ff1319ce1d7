# ruff: noqa: E501 - SQL test data reads best on one line
"""docs/gateway.md, "Dataset resolution" and "SQL rules", rule by rule: each statement is refused with its code, or accepted."""

from __future__ import annotations

import pytest

from dataplane_contracts.catalogue import Catalogue
from dataplane_service_kit.errors import ServiceError
from dataplane_testing.sqlgw import CATALOGUE
from query_gateway.sql import sql_shape, validate_query
from query_gateway.sql.validate import analyse

REFUSED = {
    "empty": ("   ", "Empty SQL"),
    "stacking": ("SELECT * FROM readings; SELECT * FROM grid.meters", "Multiple SQL statements"),
    "stacking after a write": ("SELECT * FROM readings; DELETE FROM readings", "Multiple SQL statements"),
    "line comment": ("SELECT * FROM readings -- hi", "comments"),
    "block comment": ("SELECT /* x */ * FROM readings", "comments"),
    "syntax": ("SELEC * FROM readings", "Invalid SQL syntax"),
    "unterminated string": ("SELECT 'x FROM readings", "Invalid SQL"),
    "not a select": ("DELETE FROM readings", "Disallowed SQL operation"),
    "update": ("UPDATE readings SET value = 1", "Disallowed SQL operation"),
    "ddl": ("DROP TABLE readings", "Disallowed SQL operation"),
    "top-level limit": ("SELECT * FROM readings LIMIT 5", "LIMIT not allowed in top-level"),
    "top-level offset": ("SELECT * FROM readings OFFSET 5", "LIMIT not allowed in top-level"),
    "top-level fetch": ("SELECT * FROM readings FETCH FIRST 5 ROWS ONLY", "LIMIT not allowed in top-level"),
    "union": (
        "SELECT pod FROM readings UNION SELECT pod FROM grid.meters",
        "SQL construct not allowed: Union",
    ),
    "union all": ("SELECT pod FROM readings UNION ALL SELECT pod FROM readings", "not allowed: Union"),
    "intersect": ("SELECT pod FROM readings INTERSECT SELECT pod FROM grid.meters", "not allowed: Intersect"),
    "except in a subquery": (
        "SELECT * FROM (SELECT pod FROM readings EXCEPT SELECT pod FROM grid.meters) s",
        "not allowed: Except",
    ),
    "for update": ("SELECT * FROM readings FOR UPDATE", "Locking"),
    "for share in a subquery": ("SELECT * FROM (SELECT * FROM readings FOR SHARE) s", "Locking"),
    "select into": ("SELECT * INTO copy FROM readings", "SELECT INTO"),
    "only": ("SELECT * FROM ONLY readings", "ONLY"),
    "tablesample": ("SELECT * FROM readings TABLESAMPLE SYSTEM (10)", "TABLESAMPLE"),
    "reserved alias": ("SELECT * FROM readings AS _dp_rf", "reserved"),
    "reserved alias in other case": ("SELECT * FROM readings AS _DP_RF", "reserved"),
    "reserved prefix column": ("SELECT _dp_x FROM readings", "reserved"),
    "reserved cte name": ("WITH _dp_a AS (SELECT * FROM readings) SELECT * FROM _dp_a", "reserved"),
    "system catalog": ("SELECT * FROM pg_catalog.pg_class", "System catalogs"),
    "unqualified system catalog": ("SELECT * FROM pg_roles", "System catalogs"),
    "information schema": ("SELECT * FROM information_schema.tables", "System catalogs"),
    "function not allowlisted": ("SELECT md5(pod) FROM readings", "SQL function not allowed: MD5"),
    "pg function": ("SELECT pg_sleep(1) FROM readings", "SQL function not allowed"),
    "version": ("SELECT version() FROM readings", "SQL function not allowed"),
    "string_agg": ("SELECT string_agg(pod, ',') FROM readings", "SQL function not allowed"),
    "bare current_user": ("SELECT current_user FROM readings", "SQL function not allowed"),
    "concat operator": ("SELECT pod || 'x' FROM readings", "Unsupported SQL construct"),
    "like": ("SELECT * FROM readings WHERE pod LIKE 'pod%'", "Unsupported SQL construct"),
    "modulo": ("SELECT value % 2 FROM readings", "Unsupported SQL construct"),
    "exists": ("SELECT * FROM readings WHERE EXISTS (SELECT 1 FROM grid.meters)", "not allowed"),
    "any": ("SELECT * FROM readings WHERE value = ANY(ARRAY[1])", "Unsupported SQL construct: Any"),
    "user parameter": ("SELECT * FROM readings WHERE value = $1", "Unsupported SQL construct"),
    "reg cast": ("SELECT 'pg_authid'::regclass FROM readings", "Cast to this type"),
    "unary minus on a column": ("SELECT -value FROM readings", "Unary minus"),
    "tautology in or": ("SELECT * FROM readings WHERE pod = 'x' OR 1 = 1", "Tautological"),
    "recursive cte": ("WITH RECURSIVE r AS (SELECT * FROM readings) SELECT * FROM r", "Recursive"),
    "table function": ("SELECT * FROM generate_series(1, 3)", "Table functions"),
    "no datasets": ("SELECT 1", "references no datasets"),
    "depth": ("SELECT " + " + ".join(["value"] * 250) + " FROM readings", "too complex"),
    "nesting beyond the parser": ("SELECT " + "(" * 400 + "1" + ")" * 400 + " FROM readings", "Invalid SQL"),
}


@pytest.mark.parametrize("rule", REFUSED)
def test_sql_rule_refuses_with_sql_refused(rule: str) -> None:
    sql, detail = REFUSED[rule]
    with pytest.raises(ServiceError) as err:
        validate_query(sql, CATALOGUE)
    assert err.value.code == "sql_refused"
    assert err.value.status_code == 400
    assert detail in err.value.detail


ACCEPTED = [
    "SELECT 'pod-1' AS pod, sum(value) FROM readings",
    "SELECT * FROM readings;",
    "SELECT * FROM (SELECT * FROM readings ORDER BY id LIMIT 3 OFFSET 1) s",
    "SELECT r.pod, m.kind FROM readings r LEFT JOIN grid.meters m ON r.pod = m.pod",
    "SELECT * FROM readings r CROSS JOIN grid.meters, ops.sites",
    "SELECT * FROM readings r, LATERAL (SELECT * FROM grid.meters m WHERE m.pod = r.pod) l",
    "SELECT pod, count(*) FILTER (WHERE value > 3), count(DISTINCT org) FROM readings GROUP BY pod "
    "HAVING count(*) > 1 ORDER BY pod",
    "SELECT id, row_number() OVER (PARTITION BY pod ORDER BY id), rank() OVER (ORDER BY value) FROM readings",
    "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY value) FROM readings",
    "SELECT CASE WHEN value > 3 THEN 'hi' ELSE 'lo' END, coalesce(pod, 'x'), nullif(value, 0), "
    "lower(pod), upper(pod), length(pod), abs(-1), round(value / 3.0, 2), greatest(1, value) FROM readings",
    "SELECT date_trunc('day', now()), current_date, extract(year FROM now()), now() - interval '1 day' "
    "FROM readings",
    "SELECT CAST(value AS text), value::numeric FROM readings WHERE value BETWEEN 1 AND 5 AND pod IS NOT NULL",
    "SELECT * FROM readings WHERE pod IN ('pod-1', 'pod-2') AND (value, id) IN (SELECT 1, 2 FROM ops.sites)",
    "SELECT v.x FROM (VALUES (1), (2)) AS v(x) JOIN readings ON readings.value = v.x",
    "SELECT * FROM readings WHERE 1 = 1",  # a standalone tautology is only logged upstream
]


@pytest.mark.parametrize("sql", ACCEPTED)
def test_allowed_constructs_validate(sql: str) -> None:
    assert validate_query(sql, CATALOGUE).dataset_ids


def test_dataset_ids_sorted_unique_and_dotted_ids_resolve() -> None:
    v = validate_query(
        'SELECT * FROM ops.sites s JOIN "grid.meters" g ON TRUE JOIN readings r ON TRUE '
        "JOIN READINGS r2 ON TRUE JOIN OPS.SITES s2 ON TRUE",
        CATALOGUE,
    )
    assert v.dataset_ids == ("grid.meters", "ops.sites", "readings")


def test_unknown_dataset_lists_every_unknown_reference() -> None:
    with pytest.raises(ServiceError) as err:
        validate_query("SELECT * FROM readings JOIN nope ON TRUE JOIN other.thing ON TRUE", CATALOGUE)
    assert (err.value.status_code, err.value.code) == (400, "unknown_dataset")
    assert "['nope', 'other.thing']" in err.value.detail


def test_physical_table_name_is_not_a_dataset_reference() -> None:
    with pytest.raises(ServiceError) as err:
        validate_query("SELECT * FROM public.meters", CATALOGUE)
    assert (err.value.status_code, err.value.code) == (400, "unknown_dataset")


SUFFIXED = Catalogue.model_validate(
    {
        "datasets": [
            {"id": "a.energy.meters", "table": "meters"},
            {"id": "b.energy.meters", "table": "meters"},
            {"id": "a.energy.sites", "table": "sites"},
        ]
    }
)


def test_one_dot_reference_resolves_to_the_one_id_ending_in_it() -> None:
    assert validate_query("SELECT * FROM energy.sites", SUFFIXED).dataset_ids == ("a.energy.sites",)
    assert validate_query("SELECT * FROM a.energy.meters", SUFFIXED).dataset_ids == ("a.energy.meters",)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM energy.meters",
        "SELECT * FROM a.energy.sites s JOIN ENERGY.METERS m ON TRUE",
        'WITH x AS (SELECT * FROM "energy"."meters") SELECT * FROM x',
    ],
)
def test_ambiguous_dataset_reference_is_400_ambiguous_dataset(sql: str) -> None:
    with pytest.raises(ServiceError) as err:
        validate_query(sql, SUFFIXED)
    # docs/wire-contracts.md, "Errors": unknown / ambiguous dataset reference → 400
    assert (err.value.status_code, err.value.code) == (400, "ambiguous_dataset")
    assert "energy.meters" in err.value.detail.lower() and "full dataset id" in err.value.detail


def test_qe05_cte_shadows_a_dataset_only_in_its_scope() -> None:
    # the CTE body cannot see itself: its `readings` is the dataset
    v = validate_query("WITH readings AS (SELECT * FROM readings) SELECT * FROM readings", CATALOGUE)
    assert v.dataset_ids == ("readings",)
    # a CTE inside a subquery is invisible outside it
    with pytest.raises(ServiceError) as err:
        validate_query(
            "SELECT * FROM (WITH x AS (SELECT * FROM readings) SELECT * FROM x) s JOIN x ON TRUE", CATALOGUE
        )
    assert err.value.code == "unknown_dataset" and "'x'" in err.value.detail
    # an earlier CTE cannot see a later one
    with pytest.raises(ServiceError) as err:
        validate_query(
            "WITH a AS (SELECT * FROM b), b AS (SELECT * FROM readings) SELECT * FROM a", CATALOGUE
        )
    assert err.value.code == "unknown_dataset" and "'b'" in err.value.detail
    # a later CTE sees an earlier one; a CTE that names no dataset leaves only real tables
    v = validate_query(
        "WITH a AS (SELECT * FROM grid.meters), b AS (SELECT * FROM a) SELECT * FROM b", CATALOGUE
    )
    assert v.dataset_ids == ("grid.meters",)
    # a qualified name is never a CTE
    v = validate_query("WITH sites AS (SELECT * FROM readings) SELECT * FROM ops.sites", CATALOGUE)
    assert v.dataset_ids == ("ops.sites", "readings")


def test_validated_shapes_are_cached_by_text_and_catalogue() -> None:
    sql = "SELECT pod FROM readings WHERE value > 2"
    assert analyse(sql, CATALOGUE) is analyse(sql, CATALOGUE)
    other = Catalogue.model_validate(CATALOGUE.model_dump())
    assert analyse(sql, other) is not analyse(sql, CATALOGUE)
    # a refusal is cached too, and raised afresh each time
    for _ in range(2):
        with pytest.raises(ServiceError):
            validate_query("SELECT * FROM readings LIMIT 1", CATALOGUE)


def test_qe03_sql_shape_replaces_every_literal() -> None:
    shape = sql_shape("SELECT 'pod-1' AS pod FROM readings WHERE value IN (3, 4.5) AND org = 'org-a'")
    assert "pod-1" not in shape and "org-a" not in shape and "4.5" not in shape
    assert shape == "SELECT ? AS pod FROM readings WHERE value IN (?, ?) AND org = ?"
    assert sql_shape("SELEC (((") == "<withheld: not parseable>"


def test_validated_shape_cache_is_bounded() -> None:
    from query_gateway.sql.validate import CACHE_SIZE

    first = analyse("SELECT id FROM readings WHERE value = 0", CATALOGUE)
    for n in range(1, CACHE_SIZE + 1):
        analyse(f"SELECT id FROM readings WHERE value = {n}", CATALOGUE)
    assert analyse("SELECT id FROM readings WHERE value = 0", CATALOGUE) is not first


def test_a_statement_is_narrowed_only_against_the_catalogue_it_was_validated_with() -> None:
    """The validated query carries the catalogue its names were resolved against: a catalogue read
    again since (another object, even an equal one) does not narrow it (sql_refused)."""
    from dataplane_testing.sqlgw import allow_all
    from query_gateway.sql import narrow_query

    q = validate_query("SELECT pod FROM readings", CATALOGUE)
    again = Catalogue.model_validate(CATALOGUE.model_dump())
    columns = {"public.readings": {"id": "integer", "pod": "text", "value": "integer", "org": "text"}}
    assert narrow_query(q, CATALOGUE, allow_all(), columns).sql
    with pytest.raises(ServiceError) as refused:
        narrow_query(q, again, allow_all(), columns)
    assert (refused.value.code, refused.value.detail) == (
        "sql_refused",
        "statement does not match its validation",
    )
