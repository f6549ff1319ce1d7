"""The page and count queries around a narrowed statement, and the outer ORDER BY (QE-04)."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass

import sqlglot
from sqlglot import exp

from query_gateway.sql.scope import DIALECT, fold, quoted

# the page queries' name for the statement they wrap: an outer ORDER BY names its columns through it
PAGE_ALIAS = "q"


def _output_names(select: exp.Select) -> list[str | None]:
    """Each projection's output name; `*` for a star, None for an unnamed expression."""
    names: list[str | None] = []
    for p in select.expressions:
        if isinstance(p, exp.Alias) and isinstance(p.args.get("alias"), exp.Identifier):
            names.append(fold(p.args["alias"]))
        elif isinstance(p, exp.Star) or (isinstance(p, exp.Column) and isinstance(p.this, exp.Star)):
            names.append("*")
        elif isinstance(p, exp.Column) and isinstance(p.this, exp.Identifier):
            names.append(fold(p.this))
        else:
            names.append(None)
    return names


def _single_source(select: exp.Select) -> bool:
    source = select.args.get("from_", select.args.get("from"))  # the key's name differs by sqlglot version
    return source is not None and not select.args.get("joins")


def _key_name(key: exp.Expr, select: exp.Select, names: list[str | None]) -> str | None:
    """The unique output column an ORDER BY key provably names, else None."""
    stars = names.count("*")
    lone_star = names == ["*"] and isinstance(select.expressions[0], exp.Star) and _single_source(select)
    if isinstance(key, exp.Literal):
        if key.is_string or not key.name.isdigit():
            return None
        pos = int(key.name)
        name = names[pos - 1] if 1 <= pos <= len(names) else None
    elif lone_star:
        name = (
            fold(key.this) if isinstance(key, exp.Column) and isinstance(key.this, exp.Identifier) else None
        )
    elif stars:
        return None  # a star beside other projections, or over a join: names not knowable here
    elif isinstance(key, exp.Column) and not key.table and isinstance(key.this, exp.Identifier):
        name = fold(key.this)
        if name not in names:
            return None
    else:
        matches = [i for i, p in enumerate(select.expressions) if p.unalias().sql() == key.sql()]
        name = names[matches[0]] if len(matches) == 1 else None
    if name is None or name == "*" or (not lone_star and names.count(name) != 1):
        return None
    return name


def outer_order_by(select: exp.Select) -> str:
    """`ORDER BY q."a" DESC NULLS FIRST, …` when every key names a unique output column; else ''
    (never partial). The statement's own ORDER BY stays inside either way."""
    order = select.args.get("order")
    if not isinstance(order, exp.Order) or not order.expressions:
        return ""
    names = _output_names(select)
    keys: list[str] = []
    for ordered in order.expressions:
        if not isinstance(ordered, exp.Ordered):
            return ""
        name = _key_name(ordered.this, select, names)
        if name is None:
            return ""
        desc = bool(ordered.args.get("desc"))
        nulls_first = ordered.args.get("nulls_first")
        # PostgreSQL: NULLs sort as larger than any value unless the statement says otherwise
        first = desc if nulls_first is None else bool(nulls_first)
        keys.append(
            f"{PAGE_ALIAS}.{quoted(name)} {'DESC' if desc else 'ASC'} NULLS {'FIRST' if first else 'LAST'}"
        )
    return " ORDER BY " + ", ".join(keys)


def ascending(columns: list[str]) -> str:
    """The outer ORDER BY of the page queries by these output columns, each ascending."""
    return " ORDER BY " + ", ".join(f"{PAGE_ALIAS}.{quoted(c)} ASC" for c in columns)


@dataclass(frozen=True)
class PageQueries:
    page: str  # the page: LIMIT/OFFSET bound as $n+1/$n+2
    counted_page: str  # the page with the total of the whole result as its last column
    count: str  # the total alone

    def __iter__(self) -> Iterator[str]:  # (page, count), as callers unpacked it before
        return iter((self.page, self.count))


TOTAL_COLUMN = "_dp_total"  # reserved prefix: no column of the caller's can be called that


@functools.lru_cache(maxsize=1024)
def page_and_count(sql: str, n_params: int, denied: bool, order: str | None = None) -> PageQueries:
    """The page, counted-page and count queries; cached because the narrowed statement is itself
    cached per shape, so the same text comes back request after request. `order` is the outer
    ORDER BY the rewrite took from the caller's tree (`NarrowedQuery.order_by`); without it the
    statement is parsed for it."""
    if order is None:
        tree = sqlglot.parse_one(sql, read=DIALECT)
        order = outer_order_by(tree) if isinstance(tree, exp.Select) else ""
    # a deny reads nothing on the outer queries either (RF-05)
    where = " WHERE FALSE" if denied else ""
    paging = f"{order} LIMIT ${n_params + 1} OFFSET ${n_params + 2}"
    q = PAGE_ALIAS
    return PageQueries(
        page=f"SELECT * FROM ({sql}) AS {q}{where}{paging}",  # noqa: S608 - verified statement
        # the window counts the rows before LIMIT applies, in the same scan
        counted_page=f"SELECT {q}.*, count(*) OVER () AS {TOTAL_COLUMN} FROM ({sql}) AS {q}{where}{paging}",  # noqa: S608
        count=f"SELECT count(*) FROM ({sql}) AS {q}{where}",  # noqa: S608 - verified statement
    )
