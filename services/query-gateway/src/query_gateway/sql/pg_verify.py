"""PostgreSQL's grammar has the last word (docs/gateway.md, QE-12).

Validation, the rewrite and verify.py read a statement with sqlglot, whose grammar is not
PostgreSQL's: one quoted identifier holding a dot, a keyword PostgreSQL evaluates as a function
(`system_user`), a spelling sqlglot maps onto another function — each is a place where what was
checked is not what runs. So the statement is read a second time by PostgreSQL's own parser
(libpg_query, through pglast), twice:

- `check_original`: the caller's statement. Both parsers must agree on the relations it reads
  (each with its parts, as PostgreSQL folds them) and PostgreSQL must call no function sqlglot
  did not see; a disagreement is refused with one fixed reason.
- `check_narrowed`: the rewritten statement, the text sent to the database with its `$n`
  parameters. In PostgreSQL's tree every relation read must be a narrowing subquery identical to
  one the rewrite built for a touched dataset (its real table as PostgreSQL reads the catalogue's
  `table`), or a CTE visible at that point; every function call must be allowlisted by the name
  PostgreSQL resolves; every other node must be of a kind listed here. Anything else fails closed.
- `check_records_page`, `check_changes_statement`: a statement the gateway builds over a
  narrowed one (a records page, a change session's answer) must hold it whole, with around it
  exactly the wrapping its builder makes of a constant, and that wrapping only what the narrowed
  statement's rules allow (a change session's horizon and its join to the dataset's table aside,
  each checked exactly).

All work on libpg_query's JSON tree (plain dicts), so no untyped API is needed. A refusal's
detail is a fixed reason: never the statement, a literal or a parser message."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, Final, TypeVar

import orjson
from pglast import parser as _pg
from sqlglot import exp

from dataplane_service_kit.bounded_cache import BoundedCache
from dataplane_service_kit.errors import ServiceError
from query_gateway.sql import rules
from query_gateway.sql.changes import (
    CHANGE,
    HORIZON,
    HORIZON_CTE,
    HORIZON_QUERY,
    ROWS_CTE,
    VISIBLE,
    ChangesRead,
    changes_statement,
    key_join,
)
from query_gateway.sql.changes import KEY_PREFIX as CHANGE_KEY_PREFIX
from query_gateway.sql.leakproof import LeakproofOperators, quals_leakproof
from query_gateway.sql.model import NarrowedQuery, ValidatedQuery
from query_gateway.sql.pagination import ascending, page_and_count
from query_gateway.sql.records_page import RecordsPage, key_output, wrapped
from query_gateway.sql.scope import fold, table_parts, walk_tables
from query_gateway.sql.verify import RF_ALIAS

Node = dict[str, Any]

DISAGREEMENT = "PostgreSQL's parser reads the statement differently from the validator"
_NARROWED = "the narrowed statement failed PostgreSQL's verification"

# aggregates validation allows by node type (rules.ALLOWED_NODES), not through the allowlist
_AGGREGATES: Final = frozenset({"count", "sum", "min", "max", "avg", "array_agg"})
# PostgreSQL's names for SQL-syntax calls (`trim(x)`, `substring(x FROM 1)`) of allowlisted functions
_SQL_SYNTAX: Final = {"btrim": "trim", "ltrim": "ltrim", "rtrim": "rtrim", "substring": "substring"}
_SQL_SYNTAX_PASS: Final = frozenset({"extract"})
CALLABLE: Final = (rules.FUNCTION_ALLOWLIST | _AGGREGATES) - rules.UNBOUNDED_GENERATORS

# SQL-value functions (keywords PostgreSQL evaluates without parentheses): only the allowlisted
# `current_date` and `current_timestamp`; the role, schema and catalog ones tell who and where
_SQL_VALUES: Final = {
    "SVFOP_CURRENT_DATE": "current_date",
    "SVFOP_CURRENT_TIMESTAMP": "current_timestamp",
    "SVFOP_CURRENT_TIMESTAMP_N": "current_timestamp",
}
_OPERATORS: Final = frozenset({"=", "<>", "<", ">", "<=", ">=", "+", "-", "*", "/"})
_EXPR_KINDS: Final = frozenset(
    {
        "AEXPR_OP", "AEXPR_IN", "AEXPR_NULLIF", "AEXPR_BETWEEN", "AEXPR_NOT_BETWEEN", "AEXPR_BETWEEN_SYM",
        "AEXPR_NOT_BETWEEN_SYM",
    }
)  # fmt: skip
_LIMIT_OPTIONS: Final = frozenset({"LIMIT_OPTION_DEFAULT", "LIMIT_OPTION_COUNT"})  # not WITH TIES
_SUBLINKS: Final = frozenset({"EXPR_SUBLINK", "ANY_SUBLINK"})
# casts run the target type's input or cast function: the built-in scalar types only (no reg*
# type, which reads the system catalogs; no type of the database's own)
_TYPES: Final = frozenset(
    {
        "text", "varchar", "bpchar", "int2", "int4", "int8", "float4", "float8", "numeric", "bool",
        "date", "time", "timetz", "timestamp", "timestamptz", "interval", "uuid", "bytea", "json",
        "jsonb", "geometry", "geography",
    }
)  # fmt: skip

# Each node kind PostgreSQL's tree may hold, with the fields it may carry and what each holds:
# N a node, L a list of nodes, S a scalar, V a value struct (A_Const's), A an alias, T a type
# name, W a window definition, C a WITH clause. A kind or field not listed fails closed.
_N, _L, _S, _V, _A, _T, _W, _C = "N", "L", "S", "V", "A", "T", "W", "C"
_LOC = {"location": _S}
_WINDOW = {
    "name": _S, "refname": _S, "partitionClause": _L, "orderClause": _L, "frameOptions": _S,
    "startOffset": _N, "endOffset": _N, **_LOC,
}  # fmt: skip
_KINDS: Final[dict[str, dict[str, str]]] = {
    "SelectStmt": {
        "targetList": _L, "fromClause": _L, "whereClause": _N, "groupClause": _L, "groupDistinct": _S,
        "havingClause": _N, "windowClause": _L, "sortClause": _L, "distinctClause": _L,
        "valuesLists": _L, "limitOffset": _N, "limitCount": _N, "limitOption": _S, "op": _S,
        "withClause": _C,
    },
    "ResTarget": {"name": _S, "val": _N, **_LOC},
    "ColumnRef": {"fields": _L, **_LOC},
    "A_Star": {},
    "String": {"sval": _S},
    "Integer": {"ival": _S},
    "A_Const": {"ival": _V, "fval": _V, "sval": _V, "boolval": _V, "isnull": _S, **_LOC},
    "A_Expr": {
        "kind": _S, "name": _L, "lexpr": _N, "rexpr": _N, "rexpr_list_start": _S, "rexpr_list_end": _S,
        **_LOC,
    },
    "List": {"items": _L},
    "BoolExpr": {"boolop": _S, "args": _L, **_LOC},
    "NullTest": {"arg": _N, "nulltesttype": _S, "argisrow": _S, **_LOC},
    "BooleanTest": {"arg": _N, "booltesttype": _S, **_LOC},
    "FuncCall": {
        "funcname": _L, "args": _L, "agg_order": _L, "agg_filter": _N, "over": _W,
        "agg_within_group": _S, "agg_star": _S, "agg_distinct": _S, "funcformat": _S, **_LOC,
    },
    "WindowDef": _WINDOW,
    "SortBy": {"node": _N, "sortby_dir": _S, "sortby_nulls": _S, **_LOC},
    "CaseExpr": {"arg": _N, "args": _L, "defresult": _N, **_LOC},
    "CaseWhen": {"expr": _N, "result": _N, **_LOC},
    "CoalesceExpr": {"args": _L, **_LOC},
    "MinMaxExpr": {"op": _S, "args": _L, **_LOC},
    "TypeCast": {"arg": _N, "typeName": _T, **_LOC},
    "RangeSubselect": {"lateral": _S, "subquery": _N, "alias": _A},
    "RangeVar": {
        "catalogname": _S, "schemaname": _S, "relname": _S, "inh": _S, "relpersistence": _S,
        "alias": _A, **_LOC,
    },
    "JoinExpr": {
        "jointype": _S, "isNatural": _S, "larg": _N, "rarg": _N, "usingClause": _L, "quals": _N,
        "alias": _A, "join_using_alias": _A, "rtindex": _S,
    },
    "CommonTableExpr": {"ctename": _S, "aliascolnames": _L, "ctematerialized": _S, "ctequery": _N, **_LOC},
    "SubLink": {"subLinkType": _S, "testexpr": _N, "operName": _L, "subselect": _N, **_LOC},
    "RowExpr": {"args": _L, "row_format": _S, "colnames": _L, **_LOC},
    "SQLValueFunction": {"op": _S, "typmod": _S, **_LOC},
}  # fmt: skip
_INLINE: Final[dict[str, dict[str, str]]] = {
    _A: {"aliasname": _S, "colnames": _L},
    _T: {"names": _L, "typmods": _L, "typemod": _S, "arrayBounds": _L, **_LOC},
    _W: _WINDOW,
    _C: {"ctes": _L, **_LOC},
}
_LOCATIONS = frozenset({"location", "rexpr_list_start", "rexpr_list_end", "stmt_location", "stmt_len"})


class _Refused(Exception):
    """One fixed reason; never a part of the statement."""


def parse(sql: str) -> list[Node]:
    """The statements of `sql` as libpg_query's JSON tree; raises _Refused when PostgreSQL's
    parser does not take the text."""
    try:
        tree = orjson.loads(_pg.parse_sql_json(sql))
    except Exception:  # pglast's ParseError among others: its message may quote the text
        raise _Refused("not parseable") from None
    stmts = tree.get("stmts") if isinstance(tree, dict) else None
    if not isinstance(stmts, list):
        raise _Refused("not parseable")
    return [s["stmt"] for s in stmts if isinstance(s, dict) and isinstance(s.get("stmt"), dict)]


def _only_select(sql: str) -> Node:
    stmts = parse(sql)
    if len(stmts) != 1 or not isinstance(stmts[0], dict) or set(stmts[0]) != {"SelectStmt"}:
        raise _Refused("not one SELECT")
    node: Node = stmts[0]
    return node


def canonical(node: object) -> bytes:
    """A node without its source positions, as bytes two equal trees share."""
    return orjson.dumps(_without_locations(node), option=orjson.OPT_SORT_KEYS)


def _without_locations(node: object) -> object:
    if isinstance(node, dict):
        return {k: _without_locations(v) for k, v in node.items() if k not in _LOCATIONS}
    if isinstance(node, list):
        return [_without_locations(v) for v in node]
    return node


def _names(items: object) -> list[str]:
    """A list of String nodes as its strings; _Refused for anything else."""
    if not isinstance(items, list):
        raise _Refused("a name is not a list of strings")
    out: list[str] = []
    for item in items:
        value = item.get("String") if isinstance(item, dict) else None
        sval = value.get("sval") if isinstance(value, dict) else None
        if not isinstance(sval, str):
            raise _Refused("a name is not a list of strings")
        out.append(sval)
    return out


def _reserved(name: object) -> None:
    if isinstance(name, str) and name.lower().startswith(rules.RESERVED_PREFIX):
        raise _Refused("a reserved identifier")


class _Walk:
    """One pass over PostgreSQL's tree. `fences`: the narrowing subqueries the rewrite built, in
    canonical form (the narrowed statement); None: the caller's statement, whose relation reads
    are collected instead."""

    def __init__(self, fences: frozenset[bytes] | None, types: frozenset[str] = _TYPES) -> None:
        self.fences = fences
        self.types = types  # the types a cast may name
        self.unfenced = False  # a narrowing with a filtering predicate and no barrier was read
        self.relations: list[tuple[str, ...]] = []
        self.functions: list[str] = []

    # ------------------------------------------------------------------ structure
    def node(self, value: object, ctes: frozenset[str]) -> None:
        if not isinstance(value, dict) or len(value) != 1:
            raise _Refused("a node of no known kind")
        ((kind, fields),) = value.items()
        spec = _KINDS.get(kind)
        if spec is None or not isinstance(fields, dict):
            raise _Refused("a node of a kind not allowed")
        if kind == "SelectStmt":
            self._select(fields, ctes)
            return
        if (
            kind == "RangeSubselect"
            and self.fences is not None
            and canonical(fields.get("subquery")) in self.fences
        ):
            # a narrowing subquery the rewrite built, whole: nothing in it is the caller's
            self.unfenced = self.unfenced or not _barrier_or_true(fields["subquery"])
            return
        self._fields(spec, fields, ctes)
        check = _CHECKS.get(kind)
        if check is not None:
            check(self, fields, ctes)

    def _fields(self, spec: Mapping[str, str], fields: Mapping[str, Any], ctes: frozenset[str]) -> None:
        for key, value in fields.items():
            how = spec.get(key)
            if how is None:
                raise _Refused("a clause not allowed")
            if how == _N:
                self.node(value, ctes)
            elif how == _L:
                if not isinstance(value, list):
                    raise _Refused("a malformed list")
                for item in value:
                    if item == {} and key == "distinctClause":
                        continue  # plain DISTINCT
                    self.node(item, ctes)
            elif how in (_S, _V):
                _scalar(value, nested=how == _V)
            else:
                if not isinstance(value, dict):
                    raise _Refused("a malformed clause")
                self._fields(_INLINE[how], value, ctes)
                if how == _A:
                    _reserved(value.get("aliasname"))
                elif how == _T:
                    _check_type(value, self.types)
                elif how == _C and value.get("recursive"):
                    raise _Refused("a recursive CTE")

    def _select(self, fields: Mapping[str, Any], outer: frozenset[str]) -> None:
        if fields.get("op", "SETOP_NONE") != "SETOP_NONE":
            raise _Refused("a set operation")
        if fields.get("limitOption", "LIMIT_OPTION_DEFAULT") not in _LIMIT_OPTIONS:
            raise _Refused("a clause not allowed")
        ctes = outer
        with_ = fields.get("withClause")
        rest = dict(fields)
        if with_ is not None:
            rest.pop("withClause")
            if not isinstance(with_, dict):
                raise _Refused("a malformed clause")
            self._fields(_INLINE[_C], {k: v for k, v in with_.items() if k != "ctes"}, ctes)
            if with_.get("recursive"):
                raise _Refused("a recursive CTE")
            # PostgreSQL: a CTE of a plain WITH sees the ones before it, never itself (QE-05)
            for cte in with_.get("ctes") or ():
                body = cte.get("CommonTableExpr") if isinstance(cte, dict) else None
                if not isinstance(body, dict) or not isinstance(body.get("ctename"), str):
                    raise _Refused("a malformed CTE")
                self.node(cte, ctes)
                ctes = ctes | {body["ctename"]}
        self._fields(_KINDS["SelectStmt"], rest, ctes)

    # ------------------------------------------------------------------ meaning
    def _range_var(self, fields: Mapping[str, Any], ctes: frozenset[str]) -> None:
        parts = tuple(
            p for p in (fields.get("catalogname"), fields.get("schemaname"), fields.get("relname")) if p
        )
        if not all(isinstance(p, str) for p in parts) or not parts:
            raise _Refused("a malformed relation")
        if fields.get("inh") is not True or fields.get("relpersistence", "p") != "p":
            raise _Refused("ONLY is not allowed")
        for part in parts:
            _reserved(part)
        if len(parts) == 1 and parts[0] in ctes:
            return  # a CTE's name, where PostgreSQL sees that CTE
        if self.fences is not None:
            raise _Refused("a relation read is not a narrowed dataset")
        self.relations.append(parts)

    def _func_call(self, fields: Mapping[str, Any], ctes: frozenset[str]) -> None:
        names = _names(fields.get("funcname"))
        syntax = fields.get("funcformat") == "COERCE_SQL_SYNTAX"
        if len(names) == 2 and names[0] == "pg_catalog" and syntax:
            name = names[1] if names[1] in _SQL_SYNTAX_PASS else _SQL_SYNTAX.get(names[1], "")
        elif len(names) == 1:
            name = names[0]
        else:
            raise _Refused("a function outside the allowlist")
        if name not in CALLABLE:
            raise _Refused("a function outside the allowlist")
        if fields.get("agg_star") and name != "count":
            raise _Refused("a function outside the allowlist")
        self.functions.append(name)

    def _expr(self, fields: Mapping[str, Any], ctes: frozenset[str]) -> None:
        kind = fields.get("kind")
        names = _names(fields.get("name"))
        if kind not in _EXPR_KINDS or len(names) != 1:
            raise _Refused("an operator not allowed")
        if kind in ("AEXPR_OP", "AEXPR_IN", "AEXPR_NULLIF") and names[0] not in _OPERATORS:
            raise _Refused("an operator not allowed")

    def _sublink(self, fields: Mapping[str, Any], ctes: frozenset[str]) -> None:
        if fields.get("subLinkType") not in _SUBLINKS:
            raise _Refused("a subquery form not allowed")
        if "operName" in fields and _names(fields["operName"]) != ["="]:
            raise _Refused("an operator not allowed")

    def _sql_value(self, fields: Mapping[str, Any], ctes: frozenset[str]) -> None:
        if fields.get("op") not in _SQL_VALUES:
            raise _Refused("an SQL-value function outside the allowlist")

    def _column_ref(self, fields: Mapping[str, Any], ctes: frozenset[str]) -> None:
        for item in fields.get("fields") or ():
            if isinstance(item, dict) and "String" in item:
                _reserved(item["String"].get("sval"))
            elif item != {"A_Star": {}}:
                raise _Refused("a malformed column reference")

    def _named(self, fields: Mapping[str, Any], ctes: frozenset[str]) -> None:
        _reserved(fields.get("name"))
        _reserved(fields.get("ctename"))


_CHECKS: Final = {
    "RangeVar": _Walk._range_var,
    "FuncCall": _Walk._func_call,
    "A_Expr": _Walk._expr,
    "SubLink": _Walk._sublink,
    "SQLValueFunction": _Walk._sql_value,
    "ColumnRef": _Walk._column_ref,
    "ResTarget": _Walk._named,
    "CommonTableExpr": _Walk._named,
}


def _scalar(value: object, *, nested: bool) -> None:
    if nested and isinstance(value, dict):
        for inner in value.values():
            _scalar(inner, nested=False)
        return
    if not isinstance(value, str | int | float | bool):
        raise _Refused("a malformed value")


def _check_type(type_name: Mapping[str, Any], types: frozenset[str]) -> None:
    names = _names(type_name.get("names"))
    if names[:1] == ["pg_catalog"] and len(names) == 2:
        names = names[1:]
    if len(names) != 1 or names[0] not in types:
        raise _Refused("a cast to a type not allowed")


# ---------------------------------------------------------------------- the caller's statement
def _sqlglot_relations(tree: exp.Select) -> list[tuple[str, ...]]:
    return sorted(tuple(fold(p) for p in table_parts(t)) for t, is_cte in walk_tables(tree) if not is_cte)


# sqlglot's classes of the allowlisted functions whose names are another dialect's spelling
_GLOT_NAMES: Final[dict[type[exp.Expr], str]] = {
    exp.TimestampTrunc: "date_trunc",
    exp.DateTrunc: "date_trunc",
    exp.LogicalOr: "bool_or",
    exp.LogicalAnd: "bool_and",
    exp.CurrentTimestamp: "now",
}


def _sqlglot_functions(tree: exp.Select) -> set[str]:
    out: set[str] = set()
    for node in tree.walk():
        if isinstance(node, exp.Anonymous):
            out.add(str(node.this).lower())
        elif isinstance(node, exp.Func):
            out.update(n.lower() for n in node.sql_names())
            alias = next((name for cls, name in _GLOT_NAMES.items() if isinstance(node, cls)), None)
            if alias is not None:
                out.add(alias)
    return out


_cache: BoundedCache[str, tuple[str]] = BoundedCache(1024)
_cache_lock = threading.Lock()
_OK: Final = ("",)


def check_original(q: ValidatedQuery) -> None:
    """Refuses `400 sql_refused` (DISAGREEMENT) a validated statement PostgreSQL's parser reads
    otherwise: other relations (parts as PostgreSQL folds them; a part holding a dot is one
    identifier to PostgreSQL, never a dataset id's `schema.name`), a function sqlglot did not
    see, or a node of a kind not allowed. Cached by text, like validation."""
    with _cache_lock:
        hit = _cache.get(q.text)
    if hit is None:
        try:
            _agree(q)
            hit = _OK
        except _Refused as why:
            hit = (str(why),)
        with _cache_lock:
            _cache.put(q.text, hit)
    if hit != _OK:
        raise ServiceError("sql_refused", DISAGREEMENT)


def _agree(q: ValidatedQuery) -> None:
    walk = _Walk(None)
    walk.node(_only_select(q.text.rstrip().rstrip(";")), frozenset())
    if any("." in part for parts in walk.relations for part in parts):
        raise _Refused("a relation name holds a dot")
    if sorted(walk.relations) != _sqlglot_relations(q.tree):
        raise _Refused("the relations differ")
    if not set(walk.functions) <= _sqlglot_functions(q.tree):
        raise _Refused("the functions differ")


# ---------------------------------------------------------------------- the narrowed statement
def relation_of(table: str) -> tuple[str, ...]:
    """A catalogue `table` ([schema.]name) as PostgreSQL reads it: its parts, each folded or kept."""
    select = _only_select(f"SELECT * FROM {table}")  # noqa: S608 - the catalogue's own text
    source = select["SelectStmt"].get("fromClause") or []
    rv = source[0].get("RangeVar") if len(source) == 1 and isinstance(source[0], dict) else None
    if not isinstance(rv, dict) or "alias" in rv or rv.get("catalogname"):
        raise _Refused("a catalogue table is not [schema.]name")
    return tuple(p for p in (rv.get("schemaname"), rv["relname"]) if p)


def _fence(table: str, text: str) -> bytes:
    """The canonical form of one narrowing subquery the rewrite built, after checking that it reads
    the catalogue's table, as PostgreSQL reads that table, under the reserved alias."""
    select = _only_select(text)
    fields = select["SelectStmt"]
    source = fields.get("fromClause") or []
    rv = source[0].get("RangeVar") if len(source) == 1 and isinstance(source[0], dict) else None
    if not isinstance(rv, dict) or rv.get("catalogname") or rv.get("inh") is not True:
        raise _Refused("a narrowing does not read its table")
    if tuple(p for p in (rv.get("schemaname"), rv.get("relname")) if p) != relation_of(table):
        raise _Refused("a narrowing does not read its table")
    if (rv.get("alias") or {}).get("aliasname") != RF_ALIAS:
        raise _Refused("a narrowing does not read its table")
    return canonical(select)


def _barrier_or_true(subquery: object) -> bool:
    """The narrowing carries `OFFSET 0`, or its predicate is TRUE."""
    fields = subquery.get("SelectStmt", {}) if isinstance(subquery, dict) else {}
    offset = _without_locations(fields.get("limitOffset"))
    where = _without_locations(fields.get("whereClause"))
    return offset == {"A_Const": {"ival": {}}} or where == {"A_Const": {"boolval": {"boolval": True}}}


Types = tuple[tuple[str, tuple[tuple[str, str], ...]], ...]


def statement_leakproof(
    sql: str, fences: Iterable[tuple[str, str]], types: Types, operators: LeakproofOperators
) -> bool:
    """Whether every caller qual of the narrowed `sql`, as PostgreSQL reads it, is leakproof
    (leakproof.py): then its narrowings need no barrier. False when anything is in doubt."""
    try:
        return _leakproof(_only_select(sql), {_fence(t, text): t for t, text in fences}, types, operators)
    except _Refused:
        return False


def _leakproof(stmt: Node, fences: Mapping[bytes, str], types: Types, operators: LeakproofOperators) -> bool:
    columns = {table: dict(cols) for table, cols in types}
    return quals_leakproof(stmt, lambda node: fences.get(canonical(node)), columns, operators)


_NarrowedKey = tuple[str, tuple[tuple[str, str], ...], str, int, bool, Types, LeakproofOperators]
_narrowed_cache: BoundedCache[_NarrowedKey, tuple[str]] = BoundedCache(1024)


def _narrowed_key(narrowed: NarrowedQuery) -> _NarrowedKey:
    return (
        narrowed.sql,
        narrowed.fences,
        narrowed.order_by,
        len(narrowed.params),
        narrowed.denied,
        narrowed.fence_types,
        narrowed.leakproof,
    )


def check_narrowed(narrowed: NarrowedQuery) -> None:
    """Refuses `400 sql_refused` a narrowed statement whose PostgreSQL tree reads anything but the
    rewrite's narrowing subqueries and visible CTEs, calls a function outside the allowlist, or
    holds a node of a kind not allowed. Cached by the statement and its narrowings (the
    rewrite's own output is cached per shape, so the same pair comes back)."""
    _once(_narrowed_cache, _narrowed_key(narrowed), _NARROWED, _verify_narrowed, narrowed)


def _verify_narrowed(narrowed: NarrowedQuery) -> None:
    _verify(narrowed.sql, narrowed.fences, narrowed.fence_types, narrowed.leakproof)
    _verify_pages(narrowed)


_P = TypeVar("_P")
_K = TypeVar("_K", bound=Hashable)


def _once(
    cache: BoundedCache[_K, tuple[str]], key: _K, reason: str, verify: Callable[[_P], object], arg: _P
) -> None:
    """`verify(arg)`'s verdict, kept under `key`; a refusal raised with the fixed `reason`."""
    with _cache_lock:
        hit = cache.get(key)
    if hit is None:
        try:
            verify(arg)
            hit = _OK
        except _Refused as why:
            hit = (str(why),)
        with _cache_lock:
            cache.put(key, hit)
    if hit != _OK:
        raise ServiceError("sql_refused", reason)


def _verify(
    sql: str,
    fences: Iterable[tuple[str, str]],
    types: Types = (),
    operators: LeakproofOperators = frozenset(),
) -> bool:
    """A narrowing without its barrier passes only where PostgreSQL's own tree shows every qual
    of the statement leakproof (leakproof.py), judged here again, not taken from the rewrite.
    Returns whether some narrowing goes without its barrier."""
    tables = {_fence(table, text): table for table, text in fences}
    if not tables:
        raise _Refused("no narrowing")
    stmt = _only_select(sql)
    walk = _Walk(frozenset(tables))
    walk.node(stmt, frozenset())
    if walk.unfenced and not _leakproof(stmt, tables, types, operators):
        raise _Refused("a narrowing without its barrier under a qual that may leak")
    return walk.unfenced


def _verify_pages(narrowed: NarrowedQuery) -> None:
    """The page, counted-page and count statements the executor sends (QE-04) hold the verified
    statement whole as their one subquery, and around it exactly the executor's own wrapping (the
    same wrapping of a statement that is nothing but a constant, as PostgreSQL reads both)."""
    inner = canonical(_only_select(narrowed.sql))
    n = len(narrowed.params)
    sent = page_and_count(narrowed.sql, n, narrowed.denied, narrowed.order_by)
    template = page_and_count("SELECT 1", n, narrowed.denied, narrowed.order_by)
    for text, model in zip(sent, template, strict=True):
        if _hollow(text, inner) != _hollow(model, None):
            raise _Refused("a page statement is not the executor's wrapping of the verified one")


def _only_source(select: Node) -> object:
    """The one relation a SELECT reads from."""
    source = select.get("SelectStmt", {}).get("fromClause") or []
    return source[0] if len(source) == 1 and isinstance(source[0], dict) else None


def _hollow(text: str, inner: bytes | None, source: Callable[[Node], object] = _only_source) -> bytes:
    """A page statement's canonical form with its subquery (where `source` finds it) taken out,
    after checking that the subquery is `inner` (None: not checked)."""
    select = _only_select(text)
    found = source(select)
    sub = found.get("RangeSubselect") if isinstance(found, dict) and len(found) == 1 else None
    if not isinstance(sub, dict) or (inner is not None and canonical(sub.get("subquery")) != inner):
        raise _Refused("a page statement is not the executor's wrapping of the verified one")
    sub["subquery"] = None
    return canonical(select)


# ---------------------------------------------------------------------- a records page
# what a statement built over a narrowed one is cached by, beside its own shape
_SentKey = tuple[str, str, bool, int, _NarrowedKey]


def _sent_key(narrowed: NarrowedQuery, sent: NarrowedQuery) -> _SentKey:
    return (sent.sql, sent.order_by, sent.denied, len(sent.params), _narrowed_key(narrowed))


_RecordsKey = tuple[_SentKey, tuple[tuple[str, str, str], ...], tuple[tuple[str, str], ...], bool]
_records_cache: BoundedCache[_RecordsKey, tuple[str]] = BoundedCache(1024)
_RECORDS = "the records page statement failed PostgreSQL's verification"


def check_records_page(page: RecordsPage) -> None:
    """Refuses `400 sql_refused` a records page (sql/records_page.py) unless its narrowed
    statement passes `check_narrowed`, and the statement the executor runs is, as PostgreSQL reads
    it, that narrowed statement whole as its one subquery with around it exactly the records
    wrapping of a constant; that wrapping reads no relation and holds only the node kinds, casts,
    operators and functions allowed in a narrowed statement (its bound values and the record key's
    reserved output names aside); no narrowing under its conditions goes without its barrier (the
    conditions are not judged leakproof); and the page queries the executor sends wrap it as they
    wrap any statement. Cached by the texts and the conditions' shape, never their values."""
    narrowed, sent = page.narrowed, page.statement
    check_narrowed(narrowed)
    key = (
        _sent_key(narrowed, sent),
        tuple((c.column, c.op, c.pg_type) for c in page.conditions),
        page.key,
        page.after,
    )
    _once(_records_cache, key, _RECORDS, _verify_records, page)


def _verify_records(page: RecordsPage) -> None:
    narrowed, sent = page.narrowed, page.statement
    n = len(narrowed.params)
    expected = n + len(page.conditions) + (len(page.key) if page.after else 0)
    if (
        len(sent.params) != expected
        or sent.denied != narrowed.denied
        or sent.order_by != ascending([k for k, _ in page.key])
    ):
        raise _Refused("a records page does not match its narrowed statement")
    inner = canonical(_only_select(narrowed.sql))
    template = wrapped("SELECT 1", n, page.conditions, page.key, page.after)
    if _hollow(sent.sql, inner) != _hollow(template, None):
        raise _Refused("a records page is not the records wrapping of the verified statement")
    outputs = frozenset(key_output(i) for i in range(len(page.key)))
    _Walk(frozenset()).node(_wrapping_only(_only_select(template), outputs), frozenset())
    unfenced = _verify(narrowed.sql, narrowed.fences, narrowed.fence_types, narrowed.leakproof)
    if unfenced and page.fenced_only:
        raise _Refused("a narrowing without its barrier under a records condition")
    _verify_pages(sent)


def _wrapping_only(stmt: Node, outputs: frozenset[str]) -> Node:
    """The records wrapping as the narrowed statement's rules read it: each bound value a NULL
    constant (a parameter is the gateway's own there, never the caller's), the record key's
    reserved output names of the top level taken off."""
    fields = dict(stmt["SelectStmt"])
    targets = []
    for target in fields.get("targetList") or ():
        res = target.get("ResTarget") if isinstance(target, dict) and len(target) == 1 else None
        if isinstance(res, dict) and res.get("name") in outputs:
            targets.append({"ResTarget": {k: v for k, v in res.items() if k != "name"}})
        else:
            targets.append(target)
    fields["targetList"] = targets
    out = _params_as_null({"SelectStmt": fields})
    assert isinstance(out, dict)
    return out


def _params_as_null(node: object) -> object:
    if isinstance(node, dict):
        if set(node) == {"ParamRef"}:
            return {"A_Const": {"isnull": True}}
        return {k: _params_as_null(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_params_as_null(v) for v in node]
    return node


# ---------------------------------------------------------------------- a change session's answer
_ChangesKey = tuple[_SentKey, Hashable, tuple[tuple[str, str, str], ...], int | None, bool]
_changes_cache: BoundedCache[_ChangesKey, tuple[str]] = BoundedCache(1024)
_CHANGES = "the change session statement failed PostgreSQL's verification"
# a cast of the wrapping may name xid8 as well: the change column's type, never a caller's
_CHANGE_TYPES: Final = _TYPES | {"xid8"}
TABLE_ALIAS = "t"  # the dataset's table, as the change statement's join names it


def check_changes_statement(read: ChangesRead) -> None:
    """Refuses `400 sql_refused` a change session's statement (sql/changes.py) unless its narrowed
    statement passes `check_narrowed`, and the statement the executor runs is, as PostgreSQL reads
    it, that narrowed statement whole inside its rows CTE with around it exactly the change
    session's wrapping of a constant: the horizon CTE calling `pg_snapshot_xmin
    (pg_current_snapshot())` and nothing else, the join to exactly the dataset's own table on the
    record key, and otherwise only the node kinds, casts (xid8 besides), operators and functions
    allowed in a narrowed statement, its bound values and reserved `_dp_` names aside; no
    narrowing under it goes without its barrier (its conditions are not judged leakproof); and
    the page queries the executor sends wrap it as they wrap any statement. Cached by the texts
    and the shape of the conditions and position, never their values."""
    narrowed, sent, position = read.narrowed, read.statement, read.position
    check_narrowed(narrowed)
    key = (
        _sent_key(narrowed, sent),
        read.order,
        tuple((c.field, c.sql_op, c.sql_type) for c in read.conditions),
        None if position.key is None else len(position.key),
        position.floor is None,
    )
    _once(_changes_cache, key, _CHANGES, _verify_changes, read)


def _verify_changes(read: ChangesRead) -> None:
    narrowed, sent = read.narrowed, read.statement
    try:  # the same wrapping around a constant: the values bound are never in the text
        model = changes_statement(
            dataclasses.replace(narrowed, sql="SELECT 1"), read.order, read.conditions, read.position, 1
        ).statement
    except ValueError:  # a position's key of another length than the record key's
        raise _Refused("a change session does not match its narrowed statement") from None
    if (
        len(sent.params) != len(model.params)
        or sent.denied != narrowed.denied
        or sent.order_by != model.order_by
    ):
        raise _Refused("a change session does not match its narrowed statement")
    inner = canonical(_only_select(narrowed.sql))
    if _hollow(sent.sql, inner, _rows_source) != _hollow(model.sql, None, _rows_source):
        raise _Refused("a change session is not the change wrapping of the verified statement")
    tables = {table for table, _ in narrowed.fences}
    if len(tables) != 1:
        raise _Refused("a change session reads one dataset")
    (table,) = tables
    wrapping = _change_wrapping_only(_only_select(model.sql), table, read.order.key)
    _Walk(frozenset(), _CHANGE_TYPES).node(wrapping, frozenset())
    if _verify(narrowed.sql, narrowed.fences, narrowed.fence_types, narrowed.leakproof):
        raise _Refused("a narrowing without its barrier under a change session")
    _verify_pages(sent)


def _rows_join(select: Node) -> Node:
    """The join of the narrowed rows to the dataset's table, in the change statement's rows CTE."""
    ctes = (select.get("SelectStmt", {}).get("withClause") or {}).get("ctes") or []
    body = ctes[1].get("CommonTableExpr") if len(ctes) == 2 and isinstance(ctes[1], dict) else None
    if not isinstance(body, dict) or body.get("ctename") != ROWS_CTE:
        raise _Refused("a change session is not the change wrapping of the verified statement")
    found = _only_source(body.get("ctequery") or {})
    join = found.get("JoinExpr") if isinstance(found, dict) and len(found) == 1 else None
    if not isinstance(join, dict):
        raise _Refused("a change session is not the change wrapping of the verified statement")
    return join


def _rows_source(select: Node) -> object:
    return _rows_join(select).get("larg")


def _change_wrapping_only(stmt: Node, table: str, key: tuple[str, ...]) -> Node:
    """The change wrapping (around a constant) as the narrowed statement's rules read it, after
    checking what those rules would refuse: the horizon CTE exactly `HORIZON_QUERY` (then a NULL),
    the join's relation exactly the dataset's table (then a constant) on exactly the record key;
    the reserved names of the wrapping without their prefix, each bound value a NULL."""
    ctes = stmt["SelectStmt"]["withClause"]["ctes"]
    horizon = ctes[0].get("CommonTableExpr") if isinstance(ctes[0], dict) else None
    if (
        not isinstance(horizon, dict)
        or horizon.get("ctename") != HORIZON_CTE
        or canonical(horizon.get("ctequery")) != canonical(_only_select(HORIZON_QUERY))
    ):
        raise _Refused("a change session's horizon is not the snapshot's")
    horizon["ctequery"] = _only_select("SELECT NULL AS x")
    join = _rows_join(stmt)
    rarg = join.get("rarg")
    rv = rarg.get("RangeVar") if isinstance(rarg, dict) and len(rarg) == 1 else None
    if (
        not isinstance(rv, dict)
        or rv.get("catalogname")
        or rv.get("inh") is not True
        or rv.get("relpersistence", "p") != "p"
        or tuple(p for p in (rv.get("schemaname"), rv.get("relname")) if p) != relation_of(table)
        or rv.get("alias") != {"aliasname": TABLE_ALIAS}
    ):
        raise _Refused("a change session joins a relation other than its dataset's table")
    on_key = _only_select(f"SELECT 1 WHERE {key_join(key)}")["SelectStmt"].get("whereClause")
    if canonical(join.get("quals")) != canonical(on_key):
        raise _Refused("a change session's join is not on the record key")
    join["rarg"] = {"RangeSubselect": {"subquery": _only_select("SELECT 1"), "alias": rv["alias"]}}
    names = {
        HORIZON_CTE,
        ROWS_CTE,
        HORIZON,
        CHANGE,
        VISIBLE,
        *(f"{CHANGE_KEY_PREFIX}{i}" for i in range(len(key))),
    }
    out = _params_as_null(_unreserved(stmt, frozenset(names)))
    assert isinstance(out, dict)
    return out


_NAME_FIELDS: Final = frozenset({"sval", "name", "ctename", "relname"})


def _unreserved(node: object, names: frozenset[str]) -> object:
    """`node` with each of the wrapping's own reserved `names` without its prefix: any other
    reserved name stays, and the walk refuses it."""
    if isinstance(node, dict):
        return {
            k: v.removeprefix(rules.RESERVED_PREFIX)
            if k in _NAME_FIELDS and isinstance(v, str) and v in names
            else _unreserved(v, names)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_unreserved(v, names) for v in node]
    return node


def refusal_reason(
    sql: str,
    fences: Iterable[tuple[str, str]],
    types: Types = (),
    operators: LeakproofOperators = frozenset(),
) -> str | None:
    """Why `check_narrowed` refuses (a fixed reason), None when it does not: for tests."""
    try:
        _verify(sql, fences, types, operators)
    except _Refused as why:
        return str(why)
    return None
