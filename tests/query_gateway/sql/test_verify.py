# ruff: noqa: E501 - SQL test data reads best on one line
"""The post-rewrite verifier refuses any statement in which a table read is not a narrowing
subquery carrying its dataset's predicate; narrow_query refuses what it cannot prove."""

from __future__ import annotations

import pytest

from dataplane_contracts.catalogue import Catalogue
from dataplane_service_kit.errors import ServiceError
from dataplane_testing.sqlgw import CATALOGUE, Db, allow_all, pods
from query_gateway.sql import narrow_query, validate_query
from query_gateway.sql.verify import verify_narrowed

PRED = '_dp_rf."pod" = ANY(CAST($1 AS TEXT[]))'
EXPECTED = {("public", "readings"): {(PRED, "*")}}  # (predicate, select list)
GOOD = f"SELECT * FROM (SELECT * FROM public.readings AS _dp_rf WHERE {PRED} OFFSET 0) AS r"

BAD = {
    "bare table": "SELECT * FROM public.readings",
    "bare table in a cte": f"WITH x AS (SELECT * FROM public.readings) SELECT * FROM ({GOOD}) AS y",
    "bare table in a scalar subquery": f"SELECT (SELECT count(*) FROM public.readings) AS n FROM ({GOOD}) AS y",
    "narrowing without predicate": "SELECT * FROM (SELECT * FROM public.readings AS _dp_rf) AS r",
    "narrowing with another predicate": "SELECT * FROM (SELECT * FROM public.readings AS _dp_rf WHERE TRUE) AS r",
    "narrowing with a widened predicate": f"SELECT * FROM (SELECT * FROM public.readings AS _dp_rf WHERE {PRED} OR TRUE) AS r",
    "narrowing with a join": f"SELECT * FROM (SELECT * FROM public.readings AS _dp_rf JOIN public.readings AS x ON TRUE WHERE {PRED}) AS r",
    "narrowing with projection": f"SELECT * FROM (SELECT pod FROM public.readings AS _dp_rf WHERE {PRED}) AS r",
    "uncatalogued table": f"SELECT * FROM (SELECT * FROM public.meters AS _dp_rf WHERE {PRED}) AS r",
    "stray parameter": f"SELECT $2 AS x FROM ({GOOD}) AS y",
    # the barrier (issue 19): without it the caller's predicates can see rejected rows
    "narrowing without the barrier": f"SELECT * FROM (SELECT * FROM public.readings AS _dp_rf WHERE {PRED}) AS r",
    "barrier of another offset": f"SELECT * FROM (SELECT * FROM public.readings AS _dp_rf WHERE {PRED} OFFSET 1) AS r",
    "barrier as a parameter": f"SELECT * FROM (SELECT * FROM public.readings AS _dp_rf WHERE {PRED} OFFSET $1) AS r",
    "barrier as an expression": f"SELECT * FROM (SELECT * FROM public.readings AS _dp_rf WHERE {PRED} OFFSET 0 + 0) AS r",
    "barrier with a limit": f"SELECT * FROM (SELECT * FROM public.readings AS _dp_rf WHERE {PRED} LIMIT 100 OFFSET 0) AS r",
    "barrier in a cte only": f"WITH x AS (SELECT * FROM public.readings AS _dp_rf WHERE {PRED}) SELECT * FROM ({GOOD}) AS y, x",
}


@pytest.mark.parametrize("case", BAD)
def test_verifier_refuses_an_unnarrowed_read(case: str) -> None:
    verify_narrowed(GOOD, EXPECTED, denied=False, n_params=1)  # the baseline passes
    with pytest.raises(ServiceError) as err:
        verify_narrowed(BAD[case], EXPECTED, denied=False, n_params=1)
    assert err.value.code == "sql_refused"


def test_verifier_requires_false_in_every_select_of_a_deny() -> None:
    narrowing = "(SELECT * FROM public.readings AS _dp_rf WHERE FALSE OFFSET 0) AS r"
    expected = {("public", "readings"): {("FALSE", "*")}}
    verify_narrowed(f"SELECT * FROM {narrowing} WHERE FALSE", expected, denied=True, n_params=0)
    with pytest.raises(ServiceError):
        verify_narrowed(f"SELECT * FROM {narrowing}", expected, denied=True, n_params=0)
    with pytest.raises(ServiceError):
        verify_narrowed(
            f"SELECT (SELECT 1 AS one) AS o FROM {narrowing} WHERE FALSE", expected, denied=True, n_params=0
        )


def test_narrowing_captured_by_a_cte_is_refused() -> None:
    # an unqualified physical table would be read as the statement's own CTE of that name
    catalogue = Catalogue.model_validate({"datasets": [{"id": "ds.readings", "table": "readings"}]})
    columns = {"readings": {"pod": "text"}}
    sql = "WITH readings AS (SELECT 1 AS x) SELECT * FROM ds.readings r, readings"
    with pytest.raises(ServiceError) as err:
        narrow_query(validate_query(sql, catalogue), catalogue, {"ds.readings": []}, columns)
    assert err.value.code == "sql_refused" and "verification" in err.value.detail


def test_every_touched_dataset_needs_its_plans() -> None:
    v = validate_query("SELECT * FROM readings JOIN grid.meters ON TRUE", CATALOGUE)
    columns = {"public.readings": {"pod": "text"}, "meters": {"pod": "text"}}
    with pytest.raises(ServiceError) as err:
        narrow_query(v, CATALOGUE, {"readings": pods("pod-1")["readings"]}, columns)
    assert err.value.code == "sql_refused"
    assert narrow_query(v, CATALOGUE, allow_all(), columns).sql.count("_dp_rf WHERE TRUE") == 2


def test_verifier_leaves_a_true_narrowing_unfenced_and_fences_every_other() -> None:
    """Issue 19: a predicate of TRUE hides no row, so it needs no barrier (and keeps the caller's
    predicates on the table's indexes); a deny's FALSE is fenced like any other predicate."""
    expected = {("public", "readings"): {("TRUE", "*")}}
    verify_narrowed(
        "SELECT * FROM (SELECT * FROM public.readings AS _dp_rf WHERE TRUE) AS r",
        expected,
        denied=False,
        n_params=0,
    )
    verify_narrowed(
        "SELECT * FROM (SELECT * FROM public.readings AS _dp_rf WHERE TRUE OFFSET 0) AS r",
        expected,
        denied=False,
        n_params=0,
    )
    with pytest.raises(ServiceError):
        verify_narrowed(
            "SELECT * FROM (SELECT * FROM public.readings AS _dp_rf WHERE FALSE) AS r WHERE FALSE",
            {("public", "readings"): {("FALSE", "*")}},
            denied=True,
            n_params=0,
        )


async def test_narrow_query_fences_every_filtered_read(db: Db) -> None:
    """Issue 19: every narrowing the rewrite emits with a predicate other than TRUE carries the
    barrier, in the main body, a CTE, a derived table, a scalar subquery and a join."""
    sql = (
        "WITH c AS MATERIALIZED (SELECT * FROM readings) "
        "SELECT r.id, (SELECT count(*) FROM readings x) AS n FROM readings r "
        "JOIN (SELECT * FROM readings) d ON d.id = r.id, c WHERE c.id = r.id"
    )
    narrowed = db.narrow(sql, pods("pod-1"))
    assert narrowed.sql.count("AS _dp_rf WHERE") == 4
    assert narrowed.sql.count("OFFSET 0") == 4
