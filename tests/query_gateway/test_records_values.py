"""Client filter values as docs/records.md, "Values" reads them, and the cursor's filter-set
digest over their decoded form (docs/records.md, "Cursors"): pure functions, no server."""

from __future__ import annotations

import pytest

from query_gateway.records.cursor import filter_set_digest
from query_gateway.records.request import RequestRefused
from query_gateway.records.values import bound

BIG = "1234567890123456789012345678901234567890"


def digest(*filters: tuple[str, str, str, str]) -> str:
    return filter_set_digest(tuple(bound(*f) for f in filters))


def test_records_one_value_in_two_spellings_is_one_filter_set() -> None:
    assert digest(("a", "gte", "number", "1e2")) == digest(("a", "gte", "number", "100.000"))
    assert digest(("a", "gte", "number", "-0")) == digest(("a", "gte", "number", "0.0"))
    assert digest(("t", "lt", "date-time", "2024-01-01T01:00:00+01:00")) == digest(
        ("t", "lt", "date-time", "2024-01-01T00:00:00Z")
    )
    both = (("a", "gte", "number", "1"), ("b", "lte", "integer", "2"))
    assert digest(*both) == digest(*reversed(both))


def test_records_values_beyond_a_decimal_contexts_precision_stay_distinct() -> None:
    # 41 significant digits: a 28-digit context would round both to one value
    assert digest(("a", "gte", "number", BIG + ".5")) != digest(("a", "gte", "number", BIG + ".6"))
    assert bound("a", "gte", "number", BIG + ".5").text == BIG + ".5"
    assert bound("q", "gte", "integer", BIG + "0e-1").text == BIG + ".0"


def test_records_finer_than_a_microsecond_keeps_the_comparison_exact() -> None:
    gte = bound("t", "gte", "date-time", "2024-01-02T12:00:00.0000005Z")
    lt = bound("t", "lt", "date-time", "2024-01-02T12:00:00.0000005Z")
    assert (gte.sql_op, lt.sql_op) == (">", "<=")
    assert gte.text == lt.text == "2024-01-02T12:00:00+00:00"
    assert bound("t", "gte", "date-time", "2024-01-02T12:00:00.000000Z").sql_op == ">="


@pytest.mark.parametrize(
    ("kind", "value"),
    [("number", "1e1001"), ("number", "1e-1001"), ("integer", "0.5"), ("date-time", "2024-01-01T24:00:00Z")],
)
def test_records_values_outside_what_is_compared_exactly_are_refused(kind: str, value: str) -> None:
    with pytest.raises(RequestRefused):
        bound("f", "gte", kind, value)
