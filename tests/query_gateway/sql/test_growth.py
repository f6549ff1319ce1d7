"""QE-11: every value of a statement has a static bound on its bytes, checked before anything
runs; a bound past QUERY_MAX_VALUE_BYTES, or growing calls nested past MAX_GROWTH_DEPTH, is
refused `query_too_expensive` with a reason that names the function and nothing of the data."""

from __future__ import annotations

import pytest

from dataplane_service_kit.errors import ServiceError
from dataplane_testing.sqlgw import CATALOGUE
from query_gateway.sql import validate_query
from query_gateway.sql.growth import MAX_GROWTH_DEPTH, VARIABLE_VALUE_BYTES, check_growth

# the types load_column_types reads for the sqlgw catalogue (keyed by each dataset's table)
COLUMNS = {
    "public.readings": {"id": "integer", "pod": "text", "value": "integer", "org": "text"},
    "meters": {"pod": "text", "kind": "text", "org": "text"},
    'energy."Sites"': {"site_id": "integer", "site_uuid": "uuid", "pod": "text", "name": "text"},
}
BUDGET = 4 * 1024 * 1024


def nested(levels: int, inner: str = "pod", to: str = "pod") -> str:
    expr = inner
    for _ in range(levels):
        expr = f"replace({expr}, substring(pod, 1, 1), {to})"
    return expr


def refusal(sql: str, budget: int = BUDGET) -> str | None:
    q = validate_query(sql, CATALOGUE)
    try:
        check_growth(q, COLUMNS, budget)
    except ServiceError as err:
        assert err.code == "query_too_expensive"
        return err.detail
    return None


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT pod, count(*), avg(value) FROM readings GROUP BY pod ORDER BY pod",
        "SELECT replace(pod, '-', '_') AS p FROM readings",
        "SELECT upper(pod), lower(org), substring(pod, 1, 3) FROM readings",
        "SELECT r.pod, m.kind FROM readings r JOIN grid.meters m ON m.pod = r.pod",
        "WITH x AS (SELECT pod FROM readings) SELECT replace(pod, 'a', 'bb') FROM x",
        "SELECT site_uuid::text FROM ops.sites",
    ],
)
def test_qe11_ordinary_statements_are_within_the_budget(sql: str) -> None:
    assert refusal(sql) is None


@pytest.mark.parametrize("levels", [1, 2, 20, 25, 30])
def test_qe11_a_value_replaced_by_itself_is_refused_at_every_depth(levels: int) -> None:
    # one level already: 64 KiB with every character replaced by 64 KiB is 4 GiB at worst
    detail = refusal(f"SELECT length({nested(levels)}) FROM readings WHERE id = 4")
    assert detail is not None
    assert "replace()" in detail


@pytest.mark.parametrize(
    "sql",
    [
        f"WITH x AS (SELECT {nested(20)} AS v FROM readings) SELECT length(v) FROM x",
        "WITH x AS (SELECT replace(pod, '-', pod) AS v FROM readings)"
        f" SELECT length({nested(3, 'v')}) FROM x",
        f"SELECT length(v) FROM (SELECT {nested(25)} AS v FROM readings) s",
        f"SELECT count(*) FROM readings WHERE {nested(20)} = 'x'",
        f"SELECT pod FROM readings ORDER BY {nested(20)}",
        f"SELECT array_agg(replace(pod, '-', '{'x' * 52}')) FROM readings",
        f"SELECT length(string) FROM (SELECT array_agg({nested(2)})::text AS string FROM readings) s",
    ],
)
def test_qe11_growth_through_ctes_subqueries_predicates_and_aggregates_is_refused(sql: str) -> None:
    assert refusal(sql) is not None


def test_qe11_the_reason_names_the_function_never_the_data() -> None:
    literal = "SECRET-LITERAL-0042"
    detail = refusal(f"SELECT replace(pod, '{literal}', pod) FROM readings")
    assert detail is not None
    assert literal not in detail and "pod" not in detail and "readings" not in detail


def test_qe11_growing_calls_nested_past_the_depth_are_refused_whatever_the_sizes() -> None:
    # each call only doubles its input, so a budget of 1 TiB allows the sizes: the nesting alone
    # past MAX_GROWTH_DEPTH is refused, and at the depth itself it is not
    huge_budget = 1 << 40
    at_depth = "pod"
    for _ in range(MAX_GROWTH_DEPTH):
        at_depth = f"replace({at_depth}, 'a', 'bb')"
    assert refusal(f"SELECT {at_depth} FROM readings", huge_budget) is None
    deep = "pod"
    for _ in range(MAX_GROWTH_DEPTH + 1):
        deep = f"replace({deep}, 'a', 'bb')"
    detail = refusal(f"SELECT {deep} FROM readings", huge_budget)
    assert detail is not None and "nested" in detail


def test_qe11_the_budget_is_what_decides() -> None:
    # replace(pod, '-', 'xx') at worst doubles one 64 KiB value: under a budget of 4 MiB, over one of 64 KiB
    sql = "SELECT replace(pod, '-', 'xx') FROM readings"
    assert refusal(sql) is None
    assert refusal(sql, VARIABLE_VALUE_BYTES) is not None
