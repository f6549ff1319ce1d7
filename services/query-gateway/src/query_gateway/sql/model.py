"""The shapes the SQL layer hands to the rest of the gateway (docs/gateway.md)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# physical table (as written in the catalogue) -> column -> PostgreSQL type name
ColumnTypes = Mapping[str, Mapping[str, str]]

MAX_LIMIT = 10_000  # QE-01: not configurable
DEFAULT_LIMIT = 100


@dataclass(frozen=True)
class ValidatedQuery:
    text: str  # the statement as received
    dataset_ids: tuple[str, ...]  # catalogue dataset ids the statement touches, sorted, unique


@dataclass(frozen=True)
class NarrowedQuery:
    sql: str  # rewritten statement, $1..$n placeholders
    params: tuple[object, ...]  # bound values, already of the column's Python type
    param_labels: tuple[str, ...]  # e.g. "pod keys (3 values)" — never values
    denied: bool  # some plan was a deny: FALSE in every SELECT
    # the outer ORDER BY of the page query, from the caller's tree (QE-04): paging parses nothing
    order_by: str = ""

    def __repr__(self) -> str:  # the params are personal data (RF-08)
        return f"NarrowedQuery(params=<{len(self.params)}>, denied={self.denied})"

    __str__ = __repr__


@dataclass(frozen=True)
class QueryPage:
    items: list[dict[str, object]]
    offset: int
    limit: int
    count: int
    total: int | None


class CatalogueMismatch(ValueError):
    """GS-09: a catalogue table or filter column the database lacks."""
