"""Issue 31, "one home for SQL": a records page's statement is built in `sql/` (records_page.py)
and proven by the verifier like every statement the gateway sends (QE-12, docs/records.md): the
narrowed statement whole inside, the records wrapping around it and nothing else, no relation, cast
or function the narrowed statement's rules refuse, and no narrowing without its barrier under the
page's conditions. Each forged page below is refused with the one fixed reason."""

from __future__ import annotations

import dataclasses

import pytest

from dataplane_service_kit.errors import ServiceError
from dataplane_testing.sqlgw import CATALOGUE, pods
from query_gateway.sql import (
    Condition,
    NarrowedQuery,
    RecordsPage,
    check_records_page,
    key_output,
    narrow_query,
    records_statement,
    validate_query,
)

COLUMNS = {"public.readings": {"id": "integer", "pod": "text", "value": "integer", "org": "text"}}
KEY = (("id", "integer"),)
AT_LEAST_3 = Condition("value", ">=", "3", "numeric", "filter value gte")
# an operator PostgreSQL marks leakproof: with it, a statement without caller quals goes unfenced
LEAKPROOF = frozenset({("=", "text", "text")})
REFUSED = "the records page statement failed PostgreSQL's verification"


def _narrowed(*, fenced: bool = True) -> NarrowedQuery:
    q = validate_query('SELECT * FROM "readings"', CATALOGUE)
    return narrow_query(q, CATALOGUE, pods("pod-1"), COLUMNS, leakproof=frozenset() if fenced else LEAKPROOF)


def _page(
    narrowed: NarrowedQuery | None = None,
    conditions: tuple[Condition, ...] = (AT_LEAST_3,),
    after: tuple[str, ...] | None = ("7",),
) -> RecordsPage:
    return records_statement(narrowed or _narrowed(), conditions, KEY, after)


def _refused(page: RecordsPage) -> ServiceError:
    with pytest.raises(ServiceError) as err:
        check_records_page(page)
    assert err.value.code == "sql_refused"
    assert err.value.detail == REFUSED  # fixed: never the statement, a value or a name
    return err.value


def _forged(page: RecordsPage, sql: str) -> RecordsPage:
    return dataclasses.replace(page, statement=dataclasses.replace(page.statement, sql=sql))


def test_issue31_a_records_page_is_built_in_sql_with_bound_values_and_verified() -> None:
    page = _page()
    check_records_page(page)
    sent = page.statement
    assert "'3'" not in sent.sql and "'7'" not in sent.sql  # the values are parameters
    assert sent.params[-2:] == ("3", "7")  # after the narrowing's own, condition then cursor
    assert f"AS {key_output(0)}" in sent.sql
    assert sent.order_by == ' ORDER BY q."id" ASC'
    assert page.narrowed.sql in sent.sql  # the narrowed statement whole, as verified
    # a first page without conditions, and a page over a narrowing without its barrier that
    # adds no condition, pass as well
    check_records_page(_page(conditions=(), after=None))
    check_records_page(_page(_narrowed(fenced=False), conditions=(), after=None))


@pytest.mark.parametrize(
    ("case", "forge"),
    [
        (
            "an unnarrowed read inside",
            lambda p: p.statement.sql.replace(p.narrowed.sql, "SELECT * FROM public.readings"),
        ),
        ("the inner statement changed", lambda p: p.statement.sql.replace("ANY(", "ANY(ARRAY[]::TEXT[] || ")),
        (
            "a relation in a condition",
            lambda p: p.statement.sql.replace(
                " AND ", " AND r.id > (SELECT max(id) FROM public.secrets) AND ", 1
            ),
        ),
        (
            "a function outside the allowlist",
            lambda p: p.statement.sql.replace('r."id"::text', 'md5(r."pod")'),
        ),
        ("a condition widened", lambda p: p.statement.sql.replace(" WHERE ", " WHERE TRUE OR ", 1)),
        ("a trailing comment swallowing the page's LIMIT", lambda p: p.statement.sql + " --"),
        ("a second statement", lambda p: p.statement.sql + "; SELECT 1"),
    ],
)
def test_issue31_a_forged_records_page_is_refused(case: str, forge: object) -> None:
    page = _page()
    assert callable(forge)
    forged = _forged(page, forge(page))
    assert forged.statement.sql != page.statement.sql, case
    _refused(forged)


def test_issue31_a_records_condition_over_a_narrowing_without_its_barrier_is_refused() -> None:
    """The page's conditions are not the leakproof judgement's to pass: under them every filtered
    narrowing keeps its barrier (the pipeline asks the rewrite for it), else nothing runs."""
    unfenced = _narrowed(fenced=False)
    assert "OFFSET 0" not in unfenced.sql
    _refused(_page(unfenced))
    _refused(_page(unfenced, conditions=()))  # the cursor alone is a condition too
    assert "OFFSET 0" in _narrowed().sql
    check_records_page(_page(_narrowed()))


def test_issue31_a_records_page_must_match_what_it_was_built_from() -> None:
    page = _page()
    # a cast of the cursor's key to a type the narrowed statement's rules refuse
    _refused(records_statement(page.narrowed, (AT_LEAST_3,), (("id", "regclass"),), ("7",)))
    # a parameter more than the conditions bind, an order by another column, a deny dropped
    _refused(
        dataclasses.replace(
            page, statement=dataclasses.replace(page.statement, params=(*page.statement.params, "x"))
        )
    )
    _refused(
        dataclasses.replace(
            page, statement=dataclasses.replace(page.statement, order_by=' ORDER BY q."pod" ASC')
        )
    )
    denied = narrow_query(validate_query('SELECT * FROM "readings"', CATALOGUE), CATALOGUE, pods(), COLUMNS)
    assert denied.denied
    deny_page = _page(denied)
    check_records_page(deny_page)
    _refused(dataclasses.replace(deny_page, statement=dataclasses.replace(deny_page.statement, denied=False)))


def test_issue31_a_records_condition_takes_only_a_comparison() -> None:
    with pytest.raises(ServiceError) as err:
        _page(conditions=(Condition("value", "<>", "3", "numeric", "filter value ne"),))
    assert err.value.code == "sql_refused"
