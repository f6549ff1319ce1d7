"""SQL as it may be logged: its shape, every literal replaced by `?` (QE-03)."""

from __future__ import annotations

import functools

import sqlglot
from sqlglot import exp

from query_gateway.sql.scope import DIALECT

WITHHELD = "<withheld: not parseable>"


def shape_of(tree: exp.Expr) -> str:
    """A parsed statement with every literal as `?` and comments dropped (the tree is copied)."""
    try:
        shaped = tree.transform(lambda n: exp.var("?") if isinstance(n, exp.Literal) else n)
        return str(shaped.sql(dialect=DIALECT, comments=False))
    except Exception:
        return WITHHELD


@functools.lru_cache(maxsize=1024)
def sql_shape(text: str) -> str:
    """The statement with every literal as `?` and comments dropped; never a hash, never values."""
    try:
        statements = sqlglot.parse(text, read=DIALECT)
    except Exception:
        return WITHHELD
    shapes = [shape_of(tree) for tree in statements if tree is not None]
    return "; ".join(shapes) if shapes else WITHHELD
