"""Qualified column references must name columns (issue 19).

PostgreSQL reads `rel.name` as a column when `rel` has one called `name`, and otherwise as the
function call `name(rel)` — attribute notation. `t.to_jsonb` or `t.json_agg` would so call a
function the allowlist never saw. This check accepts `rel.name` only when `name` is certainly a
column of every relation called `rel` that the reference could mean, and refuses field selection
(`(expr).name`) and references of more than two parts outright.

"Certainly": the names known for a relation are a subset of its real columns — a catalogued
table's columns read at start-up, the explicit names of a derived table or CTE (aliases, plain
column references, stars over known relations, an alias column list). A computed column without
an `AS` name is not known, so a qualified reference to it is refused with a hint to name it.

Column exposure (issue 15): a catalogued table's known names are its dataset's exposed columns
only, the names its narrowing subquery lists. In a statement reading a dataset with a `columns:`
list, a reference that names no reachable column is refused `column_not_exposed` — qualified, or
unqualified when every name in its scope is known (otherwise PostgreSQL decides, and it sees only
the exposed columns too). The decision reads exposed names alone, never the table's other
columns, so a column that exists unexposed and one that does not exist get the same answer."""

from __future__ import annotations

from collections.abc import Iterable

from sqlglot import exp

from dataplane_contracts.catalogue import Catalogue
from dataplane_service_kit.errors import ServiceError
from query_gateway.sql.exposure import dataset_columns
from query_gateway.sql.model import ColumnTypes
from query_gateway.sql.scope import fold, table_parts, table_refs
from query_gateway.sql.validate import resolve_reference

Names = tuple[str | None, ...]  # a relation's output columns in order; None: not known by name
# in a Names tuple: any number of columns, none known (a star over a relation not known by name).
# NUL cannot occur in an identifier, so no column reference can match it
_UNKNOWN_RUN = "\x00*"


def _refuse(detail: str) -> ServiceError:
    return ServiceError("sql_refused", detail)


# the one answer to every unreachable name: it must not tell an unexposed column from a missing one
NOT_EXPOSED = (
    "Query refers to a column that is not exposed; a computed column of a subquery or CTE is "
    "referred to by the name given to it with AS"
)


def _not_exposed() -> ServiceError:
    return ServiceError("column_not_exposed", NOT_EXPOSED)


class _Resolver:
    def __init__(self, catalogue: Catalogue, columns: ColumnTypes) -> None:
        self._entries = catalogue.by_id()
        self._catalogue = catalogue
        self._columns = columns
        # Select node id -> relation name -> every output-name tuple a relation of that name has
        self._sources: dict[int, dict[str, list[Names]]] = {}
        self._ordered: dict[int, list[Names]] = {}  # Select node id -> every source's names
        self._outputs: dict[int, Names] = {}
        self._declared = False  # the statement reads a dataset with a `columns:` list

    # ------------------------------------------------------------------ relations
    def outputs(self, query: exp.Expr, ctes: dict[str, Names]) -> Names:
        """The output names of a query expression (a SELECT, a parenthesised one, VALUES)."""
        if isinstance(query, exp.Subquery):
            return self.outputs(query.this, ctes)
        if isinstance(query, exp.Values):
            width = len(query.expressions[0].expressions) if query.expressions else 0
            return tuple(f"column{i}" for i in range(1, width + 1))
        if not isinstance(query, exp.Select):
            return (_UNKNOWN_RUN,)
        key = id(query)
        if key not in self._outputs:
            self._outputs[key] = self._select(query, ctes)
        return self._outputs[key]

    def _select(self, select: exp.Select, outer_ctes: dict[str, Names]) -> Names:
        ctes = dict(outer_ctes)
        with_ = select.args.get("with_", select.args.get("with"))
        if isinstance(with_, exp.With):
            for cte in with_.expressions:
                alias = cte.args["alias"]
                body = self.outputs(cte.this, ctes)
                ctes[fold(alias.this)] = _renamed(body, alias.columns)
        sources: dict[str, list[Names]] = {}
        ordered: list[Names] = []
        items = [select.args.get("from_", select.args.get("from"))]
        items += select.args.get("joins") or []
        for item in items:
            if item is None:
                continue
            name, names = self._source(item.this, ctes)
            if name is not None:
                sources.setdefault(name, []).append(names)
            ordered.append(names)
        self._sources[id(select)] = sources
        self._ordered[id(select)] = ordered
        out: list[str | None] = []
        for projection in select.expressions:
            out.extend(_projection_names(projection, sources, ordered))
        # the nested queries of this SELECT (in its clauses, not its FROM) need their sources too
        for node in select.find_all(exp.Select):
            if node is not select and id(node) not in self._outputs:
                self.outputs(node, ctes)
        return tuple(out)

    def _source(self, item: exp.Expr, ctes: dict[str, Names]) -> tuple[str | None, Names]:
        alias = item.args.get("alias")
        alias_cols = alias.columns if isinstance(alias, exp.TableAlias) else []
        alias_name = fold(alias.this) if isinstance(alias, exp.TableAlias) and alias.this else None
        if isinstance(item, exp.Table):
            parts = table_parts(item)
            name = alias_name or fold(parts[-1])
            if len(parts) == 1 and fold(parts[0]) in ctes:
                return name, _renamed(ctes[fold(parts[0])], alias_cols)
            folded, raw = table_refs(item)
            found = resolve_reference(folded, raw, self._catalogue)
            entry = self._entries[found] if found is not None else None
            known: Names = (_UNKNOWN_RUN,)
            if entry is not None and entry.table in self._columns:
                known = dataset_columns(entry, self._columns).names  # its fence's columns
                self._declared = self._declared or entry.columns is not None
            return name, _renamed(known, alias_cols)
        if isinstance(item, exp.Lateral):  # validation admits LATERAL on a subquery only
            inner_name, names = self._source(item.this, ctes)
            return alias_name or inner_name, _renamed(names, alias_cols)
        if isinstance(item, exp.Subquery | exp.Values):
            inner = item.this if isinstance(item, exp.Subquery) else item
            return alias_name, _renamed(self.outputs(inner, ctes), alias_cols)
        return alias_name, (_UNKNOWN_RUN,)

    # ------------------------------------------------------------------ references
    def check(self, root: exp.Select) -> None:
        self.outputs(root, {})
        for node in root.walk():
            if isinstance(node, exp.Dot):
                raise _refuse("Field selection ((expression).name) is not allowed")
            if isinstance(node, exp.Column):
                self._check_column(node)
            elif isinstance(node, exp.Join) and self._declared:
                for using in node.args.get("using") or ():
                    if isinstance(using, exp.Identifier):
                        self._check_unqualified(fold(using), node)

    def _check_column(self, col: exp.Column) -> None:
        if col.args.get("db") is not None or col.args.get("catalog") is not None:
            raise _refuse("A column reference may have at most two parts: relation.column")
        qualifier = col.args.get("table")
        if not isinstance(qualifier, exp.Identifier):
            # unqualified: PostgreSQL never reads a bare name as a function call
            if self._declared and isinstance(col.this, exp.Identifier):
                self._check_unqualified(fold(col.this), col)
            return
        rel = fold(qualifier)
        candidates = [
            names
            for select in _enclosing_selects(col)
            for names in self._sources.get(id(select), {}).get(rel, [])
        ]
        if not candidates:
            raise _refuse(f"Relation {qualifier.this} is not in scope")
        if isinstance(col.this, exp.Star):
            return
        name = fold(col.this) if isinstance(col.this, exp.Identifier) else None
        if name is None or any(name not in names for names in candidates):
            if self._declared:
                raise _not_exposed()
            raise _refuse(
                f"{qualifier.this}.{col.name} is not a column of {qualifier.this}; a computed column "
                "of a subquery or CTE is referred to by the name given to it with AS"
            )

    def _check_unqualified(self, name: str, node: exp.Expr) -> None:
        """Refuses a bare name that is no column, relation (a whole-row reference) or, in ORDER
        BY, GROUP BY and DISTINCT ON, output name in its scope. When a name in scope is not known
        (a computed column's implicit name, a star over an unknown relation), it is left to
        PostgreSQL, which sees the exposed columns only."""
        visible: set[str | None] = set()
        for select, via in _scopes(node):
            visible.update(self._sources.get(id(select), {}))
            for names in self._ordered.get(id(select), []):
                visible.update(names)
            if via in ("order", "group", "distinct"):
                for projection in select.expressions:
                    visible.update(_output_name(projection))
        if None in visible or _UNKNOWN_RUN in visible:
            return
        if name not in visible:
            raise _not_exposed()


def _output_name(projection: exp.Expr) -> Names:
    """A projection's explicit output name; None for one PostgreSQL names itself (`count`)."""
    if isinstance(projection, exp.Alias) and isinstance(projection.args.get("alias"), exp.Identifier):
        return (fold(projection.args["alias"]),)
    if isinstance(projection, exp.Column) and isinstance(projection.this, exp.Identifier):
        return (fold(projection.this),)
    if isinstance(projection, exp.Star) or (isinstance(projection, exp.Column) and projection.is_star):
        return ()
    return (None,)


def _scopes(node: exp.Expr) -> Iterable[tuple[exp.Select, str | None]]:
    """The SELECTs whose relations a name at `node` can refer to, innermost first, each with the
    clause of it the name sits in. A derived table in FROM or JOIN (unless LATERAL) and a CTE body
    do not see the relations of the query they are part of, only those of the queries around it."""
    prev, parent = node, node.parent
    blocked = lateral = False
    while parent is not None:
        if isinstance(parent, exp.Select):
            if not blocked:
                yield parent, prev.arg_key
            blocked = lateral = False
        elif isinstance(parent, exp.Lateral):
            lateral = True
        elif isinstance(parent, exp.From | exp.Join) and prev.arg_key == "this":
            blocked = blocked or not lateral
        elif isinstance(parent, exp.With):
            blocked = True
        prev, parent = parent, parent.parent


def _enclosing_selects(node: exp.Expr) -> Iterable[exp.Select]:
    parent = node.parent
    while parent is not None:
        if isinstance(parent, exp.Select):
            yield parent
        parent = parent.parent


def _renamed(names: Names, alias_cols: list[exp.Identifier]) -> Names:
    """An alias column list renames the first columns; after a star their positions are unknown,
    so only the alias names stay known."""
    if not alias_cols:
        return names
    given: list[str | None] = [fold(c) for c in alias_cols]
    if _UNKNOWN_RUN in names:
        return tuple(given)
    return (*given, *names[len(given) :])


def _projection_names(projection: exp.Expr, sources: dict[str, list[Names]], ordered: list[Names]) -> Names:
    if isinstance(projection, exp.Alias):
        alias = projection.args.get("alias")
        return (fold(alias),) if isinstance(alias, exp.Identifier) else (None,)
    if isinstance(projection, exp.Star):
        return tuple(n for names in ordered for n in names)
    if isinstance(projection, exp.Column):
        if isinstance(projection.this, exp.Star):
            rel = projection.args.get("table")
            found = sources.get(fold(rel), []) if isinstance(rel, exp.Identifier) else []
            return found[0] if len(found) == 1 else (_UNKNOWN_RUN,)
        if isinstance(projection.this, exp.Identifier):
            return (fold(projection.this),)
    if isinstance(projection, exp.Cast) and isinstance(projection.this, exp.Column):
        return _projection_names(projection.this, sources, ordered)
    return (None,)


def check_references(root: exp.Select, catalogue: Catalogue, columns: ColumnTypes) -> None:
    """Raises ServiceError("sql_refused") for a qualified reference that is not a known column."""
    _Resolver(catalogue, columns).check(root)
