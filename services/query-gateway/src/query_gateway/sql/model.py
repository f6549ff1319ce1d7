"""The shapes the SQL layer hands to the rest of the gateway (docs/gateway.md)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dataplane_contracts.catalogue import Catalogue, Mask

if TYPE_CHECKING:
    from sqlglot import exp

# physical table (as written in the catalogue) -> column -> PostgreSQL type name
ColumnTypes = Mapping[str, Mapping[str, str]]

MAX_LIMIT = 10_000  # QE-01: not configurable
DEFAULT_LIMIT = 100


@dataclass(frozen=True)
class ValidatedQuery:
    """A statement that passed validation, with its parse tree: the rewrite and the debug log
    read the tree, so nothing parses the statement twice. The tree is shared by the validation
    cache and never mutated (the rewrite works on a copy)."""

    text: str  # the statement as received
    dataset_ids: tuple[str, ...]  # catalogue dataset ids the statement touches, sorted, unique
    tree: exp.Select = field(compare=False, repr=False)
    # the catalogue the names were resolved against: the rewrite refuses to narrow with another
    catalogue: Catalogue = field(compare=False, repr=False)


@dataclass(frozen=True)
class DatasetColumns:
    """What one dataset exposes: its columns in table order, each with its mask (None: as is)."""

    dataset_id: str
    declared: bool  # a `columns:` list; False: every column of the table, none masked
    columns: tuple[tuple[str, Mask | None], ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.columns)

    @property
    def hashes(self) -> bool:
        return any(mask == "hash" for _, mask in self.columns)

    def as_json(self) -> dict[str, object]:
        """What `POST /query/plan` shows: names and masks, never a value or the key."""
        return {
            "declared": self.declared,
            "columns": [{"name": n} if m is None else {"name": n, "mask": m} for n, m in self.columns],
        }


@dataclass(frozen=True)
class NarrowedQuery:
    sql: str  # rewritten statement, $1..$n placeholders
    params: tuple[object, ...]  # bound values, already of the column's Python type
    param_labels: tuple[str, ...]  # e.g. "pod keys (3 values)" — never values
    denied: bool  # some plan was a deny: FALSE in every SELECT
    # the outer ORDER BY of the page query, from the caller's tree (QE-04): paging parses nothing
    order_by: str = ""
    exposure: tuple[DatasetColumns, ...] = ()  # the touched datasets' columns, as `/query/plan` shows them
    # each narrowing subquery the rewrite built: (the catalogue's `table`, the subquery's SELECT),
    # what PostgreSQL's reading of `sql` must find at every relation read (QE-12, pg_verify.py)
    fences: tuple[tuple[str, str], ...] = ()
    # the touched tables' column types and the database's leakproof comparison operators: what
    # PostgreSQL's reading of `sql` is judged by where a narrowing goes without its barrier
    fence_types: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()
    leakproof: frozenset[tuple[str, str, str]] = frozenset()

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
