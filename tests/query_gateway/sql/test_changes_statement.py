"""Issue 31 for issue 32's change sessions: a change session's statement is built in `sql/`
(changes.py) and proven by the verifier like every statement the gateway sends (QE-12,
docs/records.md, "Change sessions"): the narrowed statement whole inside, around it exactly the
change session's wrapping — the horizon from the snapshot alone, the join to the dataset's own
table on the record key — and nothing else, and no narrowing without its barrier under it. Each
forged statement below is refused with the one fixed reason."""

from __future__ import annotations

import dataclasses

import pytest

from dataplane_service_kit.errors import ServiceError
from dataplane_testing.sqlgw import CATALOGUE, pods
from query_gateway.sql import (
    ChangeOrder,
    ChangesRead,
    NarrowedQuery,
    Position,
    RangeCondition,
    changes_statement,
    check_changes_statement,
    narrow_query,
    validate_query,
)

COLUMNS = {
    "public.readings": {
        "id": "integer", "pod": "text", "value": "integer", "org": "text", "changed": "xid8",
        "deleted": "boolean",
    },
    'energy."Sites"': {"site_id": "integer", "site_uuid": "uuid", "pod": "text", "name": "text"},
}  # fmt: skip
ORDER = ChangeOrder("public.readings", "changed", "deleted", "boolean", ("id",), ("integer",))
AT_LEAST_3 = RangeCondition("value", ">=", "3", "numeric")
START = Position("0", None, None)
AFTER_7 = Position("42", ("7",), "40")
# an operator PostgreSQL marks leakproof: with it, a statement without caller quals goes unfenced
LEAKPROOF = frozenset({("=", "text", "text")})
REFUSED = "the change session statement failed PostgreSQL's verification"


def _narrowed(dataset: str = "readings", *, fenced: bool = True) -> NarrowedQuery:
    q = validate_query(f'SELECT * FROM "{dataset}"', CATALOGUE)
    return narrow_query(q, CATALOGUE, pods("pod-1"), COLUMNS, leakproof=frozenset() if fenced else LEAKPROOF)


def _read(
    narrowed: NarrowedQuery | None = None,
    order: ChangeOrder = ORDER,
    conditions: tuple[RangeCondition, ...] = (AT_LEAST_3,),
    position: Position = AFTER_7,
) -> ChangesRead:
    return changes_statement(narrowed or _narrowed(), order, conditions, position, 11)


def _refused(read: ChangesRead, reason: str = REFUSED) -> None:
    with pytest.raises(ServiceError) as err:
        check_changes_statement(read)
    assert err.value.code == "sql_refused"
    assert err.value.detail == reason  # fixed: never the statement, a value or a name


def _restated(read: ChangesRead, **fields: object) -> ChangesRead:
    """`read` with its statement's `fields` replaced."""
    return dataclasses.replace(read, statement=dataclasses.replace(read.statement, **fields))  # type: ignore[arg-type]


def _forged(read: ChangesRead, sql: str) -> ChangesRead:
    return _restated(read, sql=sql)


@pytest.mark.parametrize(
    "position", [START, Position("42", None, "40"), AFTER_7], ids=["start", "floor", "key"]
)
@pytest.mark.parametrize("conditions", [(), (AT_LEAST_3,)], ids=["unfiltered", "filtered"])
@pytest.mark.parametrize(
    "order",
    [
        ORDER,
        dataclasses.replace(ORDER, deleted="deleted_at", deleted_type="timestamp with time zone"),
        dataclasses.replace(ORDER, deleted=None, deleted_type=None),
    ],
    ids=["soft-delete", "soft-delete-timestamp", "no-soft-delete"],
)
def test_issue31_a_change_session_statement_is_built_in_sql_with_bound_values_and_verified(
    position: Position, conditions: tuple[RangeCondition, ...], order: ChangeOrder
) -> None:
    read = _read(order=order, conditions=conditions, position=position)
    check_changes_statement(read)
    sent = read.statement
    assert read.narrowed.sql in sent.sql  # the narrowed statement whole, as verified
    assert "'3'" not in sent.sql and "'42'" not in sent.sql and "'7'" not in sent.sql  # bound
    assert sent.params[-1] == 11  # the limit, bound last
    assert ("deleted" in sent.sql) == (order.deleted is not None)


def test_issue31_a_change_session_over_a_composite_key_in_another_schema_is_verified() -> None:
    order = ChangeOrder('energy."Sites"', "name", None, None, ("site_id", "pod"), ("integer", "text"))
    check_changes_statement(_read(_narrowed("ops.sites"), order, (), Position("9", ("3", "pod-1"), "5")))
    check_changes_statement(_read(_narrowed("ops.sites"), order, (), START))


@pytest.mark.parametrize(
    ("case", "forge"),
    [
        (
            "an unnarrowed read of the table inside",
            lambda r: r.statement.sql.replace(r.narrowed.sql, "SELECT * FROM public.readings"),
        ),
        ("the narrowing's barrier removed inside", lambda r: r.statement.sql.replace(" OFFSET 0", "")),
        ("the inner statement changed", lambda r: r.statement.sql.replace("ANY(", "ANY(ARRAY[]::TEXT[] || ")),
        (
            "another relation joined",
            lambda r: r.statement.sql.replace(
                ' ON t."id" = r."id"', ' ON t."id" = r."id" JOIN public.meters AS m ON m.pod = r.pod'
            ),
        ),
        (
            "the table replaced by another",
            lambda r: r.statement.sql.replace("JOIN public.readings AS t", "JOIN public.meters AS t"),
        ),
        ("the join off the key", lambda r: r.statement.sql.replace(' ON t."id" = r."id"', " ON TRUE")),
        (
            "a function added",
            lambda r: r.statement.sql.replace('r."id"::text AS', 'md5(r."pod") AS'),
        ),
        (
            "the horizon from another function",
            lambda r: r.statement.sql.replace("pg_snapshot_xmin(pg_current_snapshot())", "txid_current()"),
        ),
        (
            "a condition widened",
            lambda r: r.statement.sql.replace(' WHERE (t."changed"', ' WHERE TRUE OR (t."changed"', 1),
        ),
        ("a tombstone condition widened", lambda r: r.statement.sql.replace(" OR t.", " OR TRUE OR t.", 1)),
        ("a trailing comment swallowing the page's LIMIT", lambda r: r.statement.sql + " --"),
        ("a second statement", lambda r: r.statement.sql + "; SELECT 1"),
    ],
)
def test_issue31_a_forged_change_session_statement_is_refused(case: str, forge: object) -> None:
    read = _read()
    check_changes_statement(read)
    assert callable(forge)
    forged = _forged(read, forge(read))
    assert forged.statement.sql != read.statement.sql, case
    _refused(forged)


def test_issue31_a_change_session_over_a_narrowing_without_its_barrier_is_refused() -> None:
    """The join and conditions above the narrowed statement are not the leakproof judgement's to
    pass: under them every filtered narrowing keeps its barrier (the pipeline narrows fenced)."""
    unfenced = _narrowed(fenced=False)
    assert "OFFSET 0" not in unfenced.sql
    _refused(_read(unfenced))
    _refused(_read(unfenced, conditions=(), position=START))  # the join alone sits above it
    # the barrier removed from the narrowed statement the session was built from: that statement
    # is no longer the rewrite's, and its own check refuses it first
    fenced = _narrowed()
    stripped = dataclasses.replace(fenced, sql=fenced.sql.replace(" OFFSET 0", ""))
    _refused(_read(stripped), "the narrowed statement failed PostgreSQL's verification")


def test_issue31_a_change_session_must_match_what_it_was_built_from() -> None:
    read = _read()
    # a join to a table that is not the dataset's, built as the session would build it
    _refused(_read(order=dataclasses.replace(ORDER, table="public.meters")))
    # a cast of the position's key to a type the narrowed statement's rules refuse
    _refused(_read(order=dataclasses.replace(ORDER, key_types=("regclass",))))
    # a position's key of another length than the record key's
    _refused(dataclasses.replace(read, position=Position("42", ("7", "8"), "40")))
    # a parameter more than the statement binds, another order, a deny dropped
    _refused(_restated(read, params=(*read.statement.params, 1)))
    _refused(_restated(read, order_by=' ORDER BY q."pod" ASC'))
    denied = narrow_query(validate_query('SELECT * FROM "readings"', CATALOGUE), CATALOGUE, pods(), COLUMNS)
    assert denied.denied
    deny_read = _read(denied)
    check_changes_statement(deny_read)
    _refused(_restated(deny_read, denied=False))


def test_issue31_a_change_session_verdict_is_kept_by_shape_never_by_values() -> None:
    """The same shape with other values is the same statement text: it passes on the cached
    verdict; a forged text is a shape of its own and is judged."""
    first = _read(position=Position("42", ("7",), "40"))
    other = _read(
        conditions=(RangeCondition("value", ">=", "99", "numeric"),), position=Position("77", ("9",), "70")
    )
    assert first.statement.sql == other.statement.sql and first.statement.params != other.statement.params
    check_changes_statement(first)
    check_changes_statement(other)
    _refused(_forged(other, other.statement.sql.replace(" WHERE (", " WHERE TRUE OR (", 1)))
