"""Which table references are real tables and which are CTE names (QE-05), and how a reference
is written. Shared by validation, the rewrite and the post-rewrite verifier, so all three agree."""

from __future__ import annotations

from collections.abc import Iterator

from sqlglot import exp

DIALECT = "postgres"


def quoted(name: str) -> str:
    """A column or dataset name as a quoted PostgreSQL identifier."""
    return str(exp.to_identifier(name, quoted=True).sql(dialect=DIALECT))


def fold(ident: exp.Identifier) -> str:
    """PostgreSQL's name rule: an unquoted identifier is case-folded, a quoted one is kept."""
    name: str = ident.this
    return name if ident.quoted else name.lower()


def table_parts(table: exp.Table) -> list[exp.Identifier]:
    """Every dotted part of a table reference, outermost first (`a.b.c.d` keeps all four)."""
    parts: list[exp.Identifier] = []
    for key in ("catalog", "db"):
        part = table.args.get(key)
        if isinstance(part, exp.Identifier):
            parts.append(part)
    this = table.this
    stack: list[exp.Expr] = []
    while isinstance(this, exp.Dot):
        stack.append(this.expression)
        this = this.this
    if not isinstance(this, exp.Identifier) or not all(isinstance(p, exp.Identifier) for p in stack):
        raise ValueError("table reference is not a name")
    parts.append(this)
    parts.extend(p for p in reversed(stack) if isinstance(p, exp.Identifier))
    return parts


def table_refs(table: exp.Table) -> tuple[str, str]:
    """(folded, as written) dotted names of a reference."""
    parts = table_parts(table)
    return ".".join(fold(p) for p in parts), ".".join(str(p.this) for p in parts)


def _with_of(node: exp.Expr) -> exp.With | None:
    w = node.args.get("with_", node.args.get("with"))
    return w if isinstance(w, exp.With) else None


def walk_tables(root: exp.Expr) -> Iterator[tuple[exp.Table, bool]]:
    """Yield every Table node with whether it names a CTE visible at that point.

    PostgreSQL rules: a CTE is visible to the main body of its WITH and to the CTEs after it,
    never to itself (no RECURSIVE: validation refuses it) nor outside the query that declares it;
    a qualified name is never a CTE."""
    stack: list[tuple[exp.Expr, frozenset[str]]] = [(root, frozenset())]
    while stack:
        node, visible = stack.pop()
        if isinstance(node, exp.Table):
            parts = table_parts(node) if _is_named(node) else []
            is_cte = len(parts) == 1 and fold(parts[0]) in visible
            yield node, is_cte
            # a table's alias or sample hold no table reads, but walk them anyway so that a
            # construct we did not foresee is still seen by the caller's checks
        with_ = _with_of(node)
        inner = visible
        if with_ is not None:
            seen = set(visible)
            for cte in with_.expressions:
                stack.append((cte.this, frozenset(seen)))
                seen.add(fold(cte.args["alias"].this))
            inner = frozenset(seen)
        for key, value in node.args.items():
            if value is with_ and with_ is not None:
                continue
            children = value if isinstance(value, list) else [value]
            for child in children:
                if isinstance(child, exp.Expr) and not (
                    isinstance(node, exp.Table) and key in ("this", "db", "catalog")
                ):
                    stack.append((child, inner))


def _is_named(table: exp.Table) -> bool:
    try:
        table_parts(table)
    except ValueError:
        return False
    return True
