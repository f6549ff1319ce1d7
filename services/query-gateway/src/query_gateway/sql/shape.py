"""SQL as it may be logged: its shape, every literal replaced by `?` (QE-03)."""

from __future__ import annotations

import functools

import sqlglot
from sqlglot import exp

from query_gateway.sql.scope import DIALECT

WITHHELD = "<withheld: not parseable>"


@functools.lru_cache(maxsize=1024)
def sql_shape(text: str) -> str:
    """The statement with every literal as `?` and comments dropped; never a hash, never values."""
    try:
        statements = sqlglot.parse(text, read=DIALECT)
        shapes = []
        for tree in statements:
            if tree is None:
                continue
            shaped = tree.transform(lambda n: exp.var("?") if isinstance(n, exp.Literal) else n)
            shapes.append(shaped.sql(dialect=DIALECT, comments=False))
    except Exception:
        return WITHHELD
    return "; ".join(shapes) if shapes else WITHHELD
