"""Client filter values checked and read by the frozen type (docs/records.md, "Values"): numbers
by RFC 8259's grammar and compared by exact value (PostgreSQL numeric, never a float), dates and
date-times by their own grammar. Each value becomes text PostgreSQL reads back exactly, bound as
a parameter, and a canonical form for the cursor's filter set."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal

from query_gateway.records.request import RequestRefused

_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
_DATE_TIME = re.compile(
    r"([0-9]{4}-[0-9]{2}-[0-9]{2})[Tt]([0-9]{2}:[0-9]{2}:[0-9]{2})(?:\.([0-9]+))?([Zz]|[+-][0-9]{2}:[0-9]{2})"
)
# the magnitude PostgreSQL's numeric input reads (an exponent beyond ±1000 is refused there)
_MAX_ADJUSTED = 1000
_SQL_TYPE = {"integer": "numeric", "number": "numeric", "date": "date", "date-time": "timestamptz"}


@dataclass(frozen=True)
class Bound:
    """One checked filter: the column compared, the SQL operator, the value as text for its
    cast, and the decoded value's canonical form (the cursor binds the set of these)."""

    field: str
    op: str  # as the client sent it
    sql_op: str
    text: str
    sql_type: str
    canonical: str


_SQL_OPS = {"gte": ">=", "gt": ">", "lte": "<=", "lt": "<"}


def _invalid(kind: str) -> RequestRefused:
    return RequestRefused(f"a client filter value is not a valid {kind}")


def _number(value: str, integer: bool) -> tuple[str, str]:
    kind = "integer" if integer else "number"
    if not _NUMBER.fullmatch(value):
        raise _invalid(kind)
    d = Decimal(value)
    if d and not -_MAX_ADJUSTED <= d.adjusted() <= _MAX_ADJUSTED:
        raise _invalid(kind)
    if integer and d != d.to_integral_value():
        raise _invalid(kind)
    plain = format(d, "f")  # exact: no context precision applies to formatting
    canonical = plain.rstrip("0").rstrip(".") if "." in plain else plain
    return plain, "0" if canonical in ("-0", "0", "") else canonical


def _date(value: str) -> tuple[str, str]:
    if not _DATE.fullmatch(value):
        raise _invalid("date")
    try:
        day = date.fromisoformat(value)
    except ValueError:
        raise _invalid("date") from None
    return day.isoformat(), day.isoformat()


def _date_time(value: str, op: str) -> tuple[str, str, str]:
    """The instant to microseconds (PostgreSQL's precision), and the operator that keeps the
    comparison exact when the value has finer digits: a stored instant is at or after
    `t.0000005` exactly when it is after `t`, and at or before it when at or before `t`."""
    match = _DATE_TIME.fullmatch(value)
    if match is None:
        raise _invalid("date-time")
    day, clock, fraction, offset = match.groups()
    fraction = fraction or ""
    micro, finer = fraction[:6].ljust(6, "0"), fraction[6:].rstrip("0")
    zone = "+00:00" if offset in ("Z", "z") else offset
    try:
        instant = datetime.fromisoformat(f"{day}T{clock}.{micro}{zone}").astimezone(UTC)
    except (ValueError, OverflowError):
        raise _invalid("date-time") from None
    if finer:
        op = {"gte": "gt", "lt": "lte"}.get(op, op)
    text = instant.isoformat()
    return text, f"{text}+{finer}" if finer else text, op


def bound(field: str, op: str, kind: str, value: str) -> Bound:
    """The filter checked against its frozen type; RequestRefused (400) when the value is not
    one of the type."""
    if kind in ("integer", "number"):
        text, canonical = _number(value, kind == "integer")
    elif kind == "date":
        text, canonical = _date(value)
    else:
        text, canonical, op_used = _date_time(value, op)
        return Bound(field, op, _SQL_OPS[op_used], text, _SQL_TYPE[kind], canonical)
    return Bound(field, op, _SQL_OPS[op], text, _SQL_TYPE[kind], canonical)
