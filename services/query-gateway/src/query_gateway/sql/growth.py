"""QE-11: a static bound on the bytes every expression of a statement can produce, checked before
anything runs (docs/gateway.md, "QE-11 — No value grows past the growth budget").

PostgreSQL bounds a sort or a hash by `work_mem`, never one value: `replace(s, '-', s)` nested a
few times squares the value at each level, and the whole of it is held by one backend while the
plan-cost guard (QE-06) sees one cheap row. So the validated, pre-rewrite tree is walked once and
each expression gets a worst-case upper bound: columns from their types (the assumed size of one
variable-length value where the type has none), literals from their text, each function by its
rule below, aggregates by the rows they can fold. A bound past QUERY_MAX_VALUE_BYTES, or more than
MAX_GROWTH_DEPTH growing calls nested in one another, is refused `400 query_too_expensive` with a
fixed reason naming the function. Nothing here says anything about data: the bound follows the
statement, the catalogue and the column types only, so the refusal discloses no row.

Fail closed: a column the walk cannot resolve takes the largest bound any visible source has (its
whole row), never nothing."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from sqlglot import exp

from dataplane_contracts.catalogue import Catalogue, DatasetEntry
from dataplane_service_kit.errors import ServiceError
from query_gateway.sql.exposure import dataset_columns
from query_gateway.sql.model import ColumnTypes, ValidatedQuery
from query_gateway.sql.scope import fold, table_parts, table_refs

# The assumed size of one value of a type with no fixed width (text, varchar, bytea, json,
# geometry, arrays, enums, any type this module does not know). PostgreSQL itself allows 1 GB;
# this is an assumption about the data, stated once, so that growth is measured against it.
VARIABLE_VALUE_BYTES = 64 * 1024
# numeric without a declared precision: up to 131072 digits before the point and 16383 after
NUMERIC_BYTES = 131_072 + 16_383 + 2
# the rows an aggregate is taken to fold from one dataset that declares no `max_rows` (QE-07):
# the page cap of QE-01. An estimate, not a bound: docs/gateway.md says what it leaves open
AGGREGATE_ROWS = 10_000
# per element of an array or field of a row: the varlena header and alignment in memory, the
# quotes, the delimiter or the NULL word in its text form
ELEMENT_OVERHEAD = 8
MAX_GROWTH_DEPTH = 4  # growing calls nested in one another, whatever their sizes
# case mapping can turn one character into up to three (full mapping, e.g. U+0390) and change its
# UTF-8 width; the bytes of upper()/lower() are at most three times their input's
CASE_MAPPING_GROWTH = 3
# st_asgeojson: a coordinate's 8 bytes read as up to ~25 characters of JSON with its punctuation
GEOJSON_GROWTH = 4
_CEILING = 1 << 62  # bounds saturate here: nested squaring would otherwise build huge integers

# the widest text form of each fixed-width type (its binary form is never wider)
_FIXED_TYPES: dict[str, int] = {
    "smallint": 6,
    "integer": 11,
    "bigint": 20,
    "real": 16,
    "double precision": 25,
    "boolean": 5,
    "date": 16,
    "time without time zone": 16,
    "time with time zone": 22,
    "timestamp without time zone": 32,
    "timestamp with time zone": 40,
    "interval": 96,
    "uuid": 36,
    "oid": 10,
    "money": 32,
    "inet": 50,
    "cidr": 50,
    "macaddr": 17,
}
_HEX_TYPES = frozenset({"bytea", "geometry", "geography"})  # text form: hex, twice the bytes
_T = exp.DataType.Type
_FIXED_TARGETS: dict[object, int] = {
    _T.SMALLINT: 6,
    _T.INT: 11,
    _T.BIGINT: 20,
    _T.FLOAT: 16,
    _T.DOUBLE: 25,
    _T.BOOLEAN: 5,
    _T.DATE: 16,
    _T.TIME: 16,
    _T.TIMETZ: 22,
    _T.TIMESTAMP: 32,
    _T.TIMESTAMPTZ: 40,
    _T.INTERVAL: 96,
    _T.UUID: 36,
}
_BOOL, _COUNT, _FIXED_SMALL = 5, 20, 96  # a predicate, a count or rank, a date/time or float result
_MAX_TEXT_TYPMOD = 10_485_760  # PostgreSQL's largest char(n)/varchar(n)


class GrowthRefused(ServiceError):
    def __init__(self, detail: str) -> None:
        super().__init__("query_too_expensive", detail)


@dataclass(frozen=True)
class Bound:
    """The most bytes a value can take; `depth`: growing calls nested under it; `grower`: the
    function that made it largest (named in a refusal); `kind`: what a cast to text does to it."""

    size: int
    depth: int = 0
    grower: str | None = None
    kind: str = "scalar"  # "scalar" | "hex" (bytea, geometry) | "composite" (array, row)


_ZERO = Bound(0)


def _sat(n: int) -> int:
    return min(n, _CEILING)


def _widest(bounds: Iterable[Bound], floor: Bound = _ZERO) -> Bound:
    """The largest of `bounds` (its grower and kind), with the deepest nesting of them all."""
    out, depth = floor, floor.depth
    for b in bounds:
        depth = max(depth, b.depth)
        if b.size > out.size or (out.grower is None and b.size == out.size and b.grower is not None):
            out = b
    return Bound(out.size, depth, out.grower, out.kind)


def _type_bound(pg_type: str | None) -> Bound:
    if pg_type is None:
        return Bound(VARIABLE_VALUE_BYTES)
    if pg_type in _FIXED_TYPES:
        return Bound(_FIXED_TYPES[pg_type])
    if pg_type == "numeric":
        return Bound(NUMERIC_BYTES)
    if pg_type.endswith("[]"):
        return Bound(VARIABLE_VALUE_BYTES, kind="composite")
    return Bound(VARIABLE_VALUE_BYTES, kind="hex" if pg_type in _HEX_TYPES else "scalar")


@dataclass
class _Source:
    """One FROM item as the statement sees it: its columns' bounds and the rows it can yield."""

    name: str | None
    columns: dict[str, Bound]
    rows: int

    def whole_row(self) -> Bound:
        fields = self.columns.values()
        size = sum(b.size + ELEMENT_OVERHEAD for b in fields) + ELEMENT_OVERHEAD
        return Bound(
            _sat(size), max((b.depth for b in fields), default=0), _widest(fields).grower, "composite"
        )


@dataclass
class _Scope:
    sources: list[_Source]
    outer: _Scope | None
    rows: int  # the rows an aggregate of this SELECT folds
    outputs: dict[str, Bound] = field(default_factory=dict)  # select-list names, for ORDER/GROUP BY

    def chain(self) -> Iterable[_Scope]:
        s: _Scope | None = self
        while s is not None:
            yield s
            s = s.outer


@dataclass
class _Select:
    columns: dict[str, Bound]
    rows: int


class _Walk:
    def __init__(self, catalogue: Catalogue, columns: ColumnTypes, limit: int) -> None:
        self.catalogue = catalogue
        self.types = columns
        self.limit = limit
        self.entries = {e.id: e for e in catalogue.datasets}

    # ------------------------------------------------------------------ checks
    def checked(self, b: Bound) -> Bound:
        if b.depth > MAX_GROWTH_DEPTH:
            raise GrowthRefused(
                f"{_named(b.grower)} is nested in more than {MAX_GROWTH_DEPTH} growing calls (QE-11)"
            )
        if b.size > self.limit:
            raise GrowthRefused(f"the value {_named(b.grower)} can produce exceeds the growth budget (QE-11)")
        return b

    # ------------------------------------------------------------------ statements
    def select(self, node: exp.Expr, outer: _Scope | None, ctes: Mapping[str, _Select]) -> _Select:
        if isinstance(node, exp.Subquery):
            return self.select(node.this, outer, ctes)
        if isinstance(node, exp.Values):
            return self._values(node, outer, ctes)
        if not isinstance(node, exp.Select):
            # the rules admit no other statement; an unforeseen one gets no bound and is refused
            raise GrowthRefused("the statement's values have no bound the gateway can compute (QE-11)")
        visible = dict(ctes)
        with_ = node.args.get("with_")
        if isinstance(with_, exp.With):
            for cte in with_.expressions:
                alias = cte.args["alias"]
                visible[fold(alias.this)] = _renamed(self.select(cte.this, outer, visible), alias)
        scope = _Scope([], outer, 1)
        from_ = node.args.get("from_")
        items = ([from_.this] if isinstance(from_, exp.From) else []) + [
            j.this for j in node.args.get("joins") or []
        ]
        for item in items:
            scope.sources.append(self._source(item, scope, visible))
        rows = 1
        for s in scope.sources:
            rows = _sat(rows * max(1, s.rows))  # a join yields at most the product
        scope.rows = rows
        columns: dict[str, Bound] = {}
        for i, projection in enumerate(node.expressions):
            for name, b in self._projection(projection, scope, visible, i):
                columns.setdefault(name, b)
        scope.outputs = columns
        for key, value in node.args.items():
            if key in ("expressions", "with_", "from_"):
                continue
            for child in value if isinstance(value, list) else [value]:
                if isinstance(child, exp.Join):
                    self.expr(child.args.get("on"), scope, visible)
                elif isinstance(child, exp.Expr):
                    self.expr(child, scope, visible)
        out_rows = rows
        if not node.args.get("group") and _aggregates(node):
            out_rows = 1
        limit = node.args.get("limit")
        if isinstance(limit, exp.Limit) and isinstance(limit.expression, exp.Literal):
            with contextlib.suppress(ValueError):
                out_rows = min(out_rows, max(0, int(limit.expression.this)))
        return _Select(columns, out_rows)

    def _values(self, node: exp.Values, outer: _Scope | None, ctes: Mapping[str, _Select]) -> _Select:
        scope = _Scope([], outer, 1)
        widths: list[list[Bound]] = []
        for row in node.expressions:
            cells = row.expressions if isinstance(row, exp.Tuple) else [row]
            for i, cell in enumerate(cells):
                if i == len(widths):
                    widths.append([])
                widths[i].append(self.expr(cell, scope, ctes))
        columns = {f"column{i + 1}": _widest(w) for i, w in enumerate(widths)}
        return _Select(columns, max(1, len(node.expressions)))

    def _source(self, item: exp.Expr, scope: _Scope, ctes: Mapping[str, _Select]) -> _Source:
        alias = item.args.get("alias")
        if isinstance(item, exp.Lateral):
            inner = _renamed(self.select(item.this, scope, ctes), alias)
            return _Source(_alias_name(alias), inner.columns, inner.rows)
        if isinstance(item, exp.Subquery | exp.Values):
            # a derived table does not see its siblings; the scope's outer does (correlation)
            inner = _renamed(self.select(item, scope.outer, ctes), alias)
            return _Source(_alias_name(alias), inner.columns, inner.rows)
        if isinstance(item, exp.Table):
            parts = table_parts(item)
            name = _alias_name(alias) or fold(parts[-1])
            if len(parts) == 1 and fold(parts[0]) in ctes:
                cte = ctes[fold(parts[0])]
                return _Source(name, _renamed_columns(cte.columns, alias), cte.rows)
            entry = self._entry(item)
            return _Source(name, _renamed_columns(self._dataset_columns(entry), alias), _rows_of(entry))
        raise GrowthRefused("the statement's values have no bound the gateway can compute (QE-11)")

    def _entry(self, table: exp.Table) -> DatasetEntry:
        from query_gateway.sql.validate import resolve_reference  # validate imports the rules only

        folded, raw = table_refs(table)
        found = resolve_reference(folded, raw, self.catalogue)
        if found is None:  # validation resolved every reference; a miss here is refused
            raise GrowthRefused("the statement's values have no bound the gateway can compute (QE-11)")
        return self.entries[found]

    def _dataset_columns(self, entry: DatasetEntry) -> dict[str, Bound]:
        """The columns a statement sees of a dataset: the exposed ones, a `hash` mask as its
        pseudonym's 64 hex characters, a `null` mask as nothing."""
        types = self.types.get(entry.table, {})
        out: dict[str, Bound] = {}
        for name, mask in dataset_columns(entry, self.types).columns:
            if mask == "hash":
                out[name] = Bound(64)
            elif mask == "null":
                out[name] = _ZERO
            else:
                out[name] = _type_bound(types.get(name))
        return out

    def _projection(
        self, node: exp.Expr, scope: _Scope, ctes: Mapping[str, _Select], i: int
    ) -> list[tuple[str, Bound]]:
        if isinstance(node, exp.Star):
            return [(n, b) for s in scope.sources for n, b in s.columns.items()]
        if isinstance(node, exp.Column) and isinstance(node.this, exp.Star):
            source = _source_named(scope, node.table)
            if source is None:
                return [("?column?", self.checked(_fallback(scope)))]
            return list(source.columns.items())
        b = self.expr(node, scope, ctes)
        name = node.alias_or_name if isinstance(node, exp.Alias | exp.Column) else ""
        if not name:
            name = node.sql_name().lower() if isinstance(node, exp.Func) else f"?column{i}?"
        return [(name.lower() if not _quoted(node) else name, b)]

    # ------------------------------------------------------------------ expressions
    def expr(self, node: exp.Expr | None, scope: _Scope, ctes: Mapping[str, _Select]) -> Bound:
        if node is None:
            return _ZERO
        return self.checked(self._expr(node, scope, ctes))

    def _args(
        self, nodes: Iterable[exp.Expr | None], scope: _Scope, ctes: Mapping[str, _Select]
    ) -> list[Bound]:
        return [self.expr(n, scope, ctes) for n in nodes if n is not None]

    def _children(self, node: exp.Expr, scope: _Scope, ctes: Mapping[str, _Select]) -> list[Bound]:
        return self._args(node.iter_expressions(), scope, ctes)

    def _expr(self, node: exp.Expr, scope: _Scope, ctes: Mapping[str, _Select]) -> Bound:
        if isinstance(node, exp.Literal):
            return Bound(len(str(node.this).encode("utf-8")))
        if isinstance(node, exp.Null | exp.Star):
            return _ZERO
        if isinstance(node, exp.Boolean):
            return Bound(_BOOL)
        if isinstance(node, exp.Column):
            return self._column(node, scope)
        if isinstance(node, exp.Subquery):
            inner = self.select(node.this, scope, ctes)  # a scalar subquery: its one column
            return _widest(inner.columns.values())
        if isinstance(node, exp.Cast):
            return self._cast(node, scope, ctes)
        if isinstance(node, exp.Replace):
            return self._replace(node, scope, ctes)
        if isinstance(node, exp.Upper | exp.Lower):
            s = self.expr(node.this, scope, ctes)
            return Bound(_sat(s.size * CASE_MAPPING_GROWTH), s.depth, s.grower)
        if isinstance(node, exp.ArrayAgg):
            return self._aggregate(node, scope, ctes)
        if isinstance(node, exp.Anonymous) and str(node.this).lower() == "st_asgeojson":
            args = self._children(node, scope, ctes)
            g = args[0] if args else _ZERO
            return Bound(_sat(g.size * GEOJSON_GROWTH + 64), g.depth + 1, "st_asgeojson")
        if isinstance(node, exp.Substring | exp.Trim):
            rest = self._children(node, scope, ctes)  # checked, but a part is never wider
            return self.expr(node.this, scope, ctes) if rest else _ZERO
        if isinstance(node, exp.Predicate | exp.Connector | exp.Not | exp.LogicalOr | exp.LogicalAnd):
            self._children(node, scope, ctes)
            return Bound(_BOOL)
        if isinstance(node, exp.Count | exp.Length | exp.RowNumber | exp.Rank | exp.DenseRank):
            self._children(node, scope, ctes)
            return Bound(_COUNT)
        if isinstance(node, exp.Sum | exp.Avg):
            return _widest(self._children(node, scope, ctes), Bound(NUMERIC_BYTES))
        if isinstance(node, exp.Binary) and isinstance(node, exp.Add | exp.Sub | exp.Mul | exp.Div):
            # numeric's result is bounded by numeric's own limit; every other type is fixed
            return _widest(self._children(node, scope, ctes), Bound(NUMERIC_BYTES))
        if isinstance(
            node,
            exp.Interval
            | exp.CurrentDate
            | exp.CurrentTimestamp
            | exp.Date
            | exp.DateTrunc
            | exp.TimestampTrunc
            | exp.Extract,
        ):
            self._children(node, scope, ctes)
            return Bound(_FIXED_SMALL)
        if isinstance(node, exp.Case):
            self._args([i.this for i in node.args.get("ifs") or []], scope, ctes)
            self.expr(node.this, scope, ctes)
            values = [i.args.get("true") for i in node.args.get("ifs") or []] + [node.args.get("default")]
            return _widest(self._args(values, scope, ctes))
        if isinstance(node, exp.If):
            self.expr(node.this, scope, ctes)
            return _widest(self._args([node.args.get("true"), node.args.get("false")], scope, ctes))
        # structure (Paren, Alias, Distinct, Filter, Window, Ordered…) and an allowlisted
        # function this module does not model (coalesce, greatest, round, the other PostGIS
        # ones…): at most the widest of what it is given; none of them is a known grower
        return _widest(self._children(node, scope, ctes))

    def _column(self, node: exp.Column, scope: _Scope) -> Bound:
        name = fold(node.this) if isinstance(node.this, exp.Identifier) else node.name
        qualifier = node.table
        for s in scope.chain():
            if qualifier:
                source = _source_named(s, qualifier)
                if source is not None:
                    return source.columns[name] if name in source.columns else _fallback(scope)
                continue
            hits = [src.columns[name] for src in s.sources if name in src.columns]
            if hits:
                return _widest(hits)
            whole = _source_named(s, name)
            if whole is not None:  # PostgreSQL: a bare name that is no column is the whole row
                return whole.whole_row()
            if name in s.outputs:
                return s.outputs[name]
        return _fallback(scope)

    def _cast(self, node: exp.Cast, scope: _Scope, ctes: Mapping[str, _Select]) -> Bound:
        s = self.expr(node.this, scope, ctes)
        to = node.args.get("to")
        if not isinstance(to, exp.DataType):
            return s
        kind = to.this
        if kind in _FIXED_TARGETS:
            return Bound(_FIXED_TARGETS[kind], s.depth, s.grower)
        if kind == _T.DECIMAL:
            return Bound(NUMERIC_BYTES, s.depth, s.grower)
        if to.is_type(*exp.DataType.TEXT_TYPES) or kind == _T.BPCHAR:
            # the text form: a row's or array's quotes and escapes at most double it, bytea's hex
            # is twice its bytes plus `\x`
            text = _sat(s.size * 2 + 2) if s.kind in ("composite", "hex") else s.size
            n = _typmod(to)
            if kind in (_T.CHAR, _T.NCHAR, _T.BPCHAR) and (n is not None or kind != _T.BPCHAR):
                n = 1 if n is None else n
                # char(n) cuts to n characters (4 bytes at most each) and pads with spaces to n
                return Bound(_sat(min(text, 4 * n) + n), s.depth, s.grower or "cast")
            if n is not None:
                text = min(text, 4 * n)
            return Bound(text, s.depth, s.grower)
        if kind in (_T.JSON, _T.JSONB):
            return Bound(_sat(s.size * 2), s.depth, s.grower)  # jsonb's output adds spaces
        if kind == _T.ARRAY:
            # each element of the text form takes at least two characters and at most 8 bytes
            # in memory, after the array's header
            return Bound(_sat(s.size * 4 + 64), s.depth, s.grower, "composite")
        return s

    def _replace(self, node: exp.Replace, scope: _Scope, ctes: Mapping[str, _Select]) -> Bound:
        s = self.expr(node.this, scope, ctes)
        self.expr(node.expression, scope, ctes)
        to = self.expr(node.args.get("replacement"), scope, ctes)
        # worst case every character of s is an occurrence of a one-character `from`
        size = _sat(s.size * max(1, to.size))
        depth = max(s.depth, to.depth)
        if to.size > 1:
            return Bound(size, depth + 1, "replace")
        return Bound(size, depth, s.grower)

    def _aggregate(self, node: exp.ArrayAgg, scope: _Scope, ctes: Mapping[str, _Select]) -> Bound:
        parts = self._children(node, scope, ctes)
        element = parts[0] if parts else _ZERO
        size = _sat(scope.rows * (element.size + ELEMENT_OVERHEAD) + 64)
        return Bound(size, element.depth + 1, "array_agg", "composite")


def _named(grower: str | None) -> str:
    return f"{grower}()" if grower else "a column"


def _quoted(node: exp.Expr) -> bool:
    ident = node.args.get("alias") if isinstance(node, exp.Alias) else node.this
    if isinstance(ident, exp.TableAlias):
        ident = ident.this
    return isinstance(ident, exp.Identifier) and bool(ident.quoted)


def _alias_name(alias: exp.Expr | None) -> str | None:
    if isinstance(alias, exp.TableAlias) and isinstance(alias.this, exp.Identifier):
        return fold(alias.this)
    return None


def _renamed_columns(columns: dict[str, Bound], alias: exp.Expr | None) -> dict[str, Bound]:
    """A column alias list (`AS d(a, b)`) renames the first columns in order."""
    names = alias.args.get("columns") if isinstance(alias, exp.TableAlias) else None
    if not names:
        return columns
    bounds = list(columns.values())
    renamed = {fold(n): b for n, b in zip(names, bounds, strict=False) if isinstance(n, exp.Identifier)}
    for n, b in list(columns.items())[len(names) :]:
        renamed.setdefault(n, b)
    return renamed


def _renamed(inner: _Select, alias: exp.Expr | None) -> _Select:
    return _Select(_renamed_columns(inner.columns, alias), inner.rows)


def _source_named(scope: _Scope, name: str) -> _Source | None:
    for s in scope.sources:
        if s.name == name.lower() or s.name == name:
            return s
    return None


def _fallback(scope: _Scope) -> Bound:
    """A name the walk cannot resolve: the widest whole row of any visible source, so the bound
    is never below what the name could mean."""
    rows = [s.whole_row() for sc in scope.chain() for s in sc.sources]
    return _widest(rows, Bound(VARIABLE_VALUE_BYTES))


def _rows_of(entry: DatasetEntry) -> int:
    return entry.max_rows if entry.max_rows is not None else AGGREGATE_ROWS


def _typmod(to: exp.DataType) -> int | None:
    params = to.expressions
    if params and isinstance(params[0], exp.DataTypeParam) and isinstance(params[0].this, exp.Literal):
        try:
            return min(int(params[0].this.this), _MAX_TEXT_TYPMOD)
        except ValueError:
            return None
    return None


def _aggregates(select: exp.Select) -> bool:
    """Whether the select list folds rows (an aggregate outside a window and a subquery)."""
    for projection in select.expressions:
        for agg in projection.find_all(exp.AggFunc):
            if agg.find_ancestor(exp.Window, exp.Subquery, exp.Select) is select or (
                agg.find_ancestor(exp.Window) is None and agg.find_ancestor(exp.Select) is select
            ):
                return True
    return False


def check_growth(q: ValidatedQuery, columns: ColumnTypes, max_value_bytes: int) -> None:
    """QE-11: refuses `query_too_expensive` when any value of the statement can exceed
    `max_value_bytes`, or when growing calls nest past MAX_GROWTH_DEPTH."""
    _Walk(q.catalogue, columns, max_value_bytes).select(q.tree, None, {})
