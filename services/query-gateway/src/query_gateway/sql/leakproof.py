"""Which narrowings need the barrier (docs/row-filters.md, "Fenced only where a caller qual can leak").

The `OFFSET 0` barrier exists for one reason: a caller predicate PostgreSQL evaluates on a row
*before* the row filter rejects it can turn an error into an answer about that row. PostgreSQL's
own security-barrier views and row-level security draw the line at *leakproof* functions: a
function marked `proleakproof` reveals nothing about its arguments but its result, so it may run
before the security quals. The same line decides here, for the whole statement at once:

- every qual of the statement — each `WHERE`, `HAVING` (PostgreSQL moves one without aggregates
  into `WHERE`) and `JOIN … ON`, at every level, since PostgreSQL pulls subqueries up and pushes
  quals down through them — is made only of `AND`/`OR`/`NOT`, `IS [NOT] NULL`, constants, plain
  exposed columns of a narrowing, and comparisons (`= <> < > <= >=`, `IN (…)`, `BETWEEN`) whose
  operator, for the exact operand types, PostgreSQL marks leakproof (read from `pg_operator` and
  `pg_proc` at start-up, never assumed); then no narrowing is fenced;
- anything else — a function, arithmetic, a cast, a subquery in a qual, `USING`/`NATURAL`, a
  column the rule cannot type or that a mask computes, an operator whose resolution needs an
  implicit cast — and every narrowing keeps its barrier.

The classification reads PostgreSQL's own tree of the narrowed statement (libpg_query's JSON, the
tree pg_verify.py proves), so what is judged is what runs. Operand typing is deliberately narrow:
a column's type is the catalogue table's; a quoted literal takes the other side's type (PostgreSQL's
rule for an `unknown` operand); an integer literal is `integer`, or `bigint` past 32 bits; any
other literal is `numeric`. A comparison with no operator for exactly those types is not judged
leakproof, even where PostgreSQL would find one through a cast."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

import asyncpg

from query_gateway.sql.model import ColumnTypes
from query_gateway.sql.verify import RF_ALIAS

Node = dict[str, Any]
# (operator, left operand type, right operand type), type names as format_type gives them
LeakproofOperators = frozenset[tuple[str, str, str]]
COMPARISONS: Final = ("=", "<>", "<", ">", "<=", ">=")
_UNKNOWN: Final = "unknown"
_INT4: Final = 2**31
_INT8: Final = 2**63


async def load_leakproof_operators(pool: asyncpg.Pool) -> LeakproofOperators:
    """The binary comparison operators whose function this database marks leakproof."""
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT o.oprname, format_type(o.oprleft, NULL) AS l, format_type(o.oprright, NULL) AS r"
            " FROM pg_operator o JOIN pg_proc p ON p.oid = o.oprcode"
            " WHERE o.oprkind = 'b' AND p.proleakproof AND o.oprname = ANY($1::text[])",
            list(COMPARISONS),
        )
    return frozenset((r["oprname"], r["l"], r["r"]) for r in rows)


# a fence's subquery node -> its catalogue table (None: not a narrowing the rewrite built)
FenceOf = Callable[[object], str | None]


def quals_leakproof(
    stmt: Node, fence_of: FenceOf, columns: ColumnTypes, operators: LeakproofOperators
) -> bool:
    """True when no qual anywhere in `stmt` (a `{"SelectStmt": …}` node) can reveal anything
    about a row it is evaluated on: the narrowings may then go without the barrier."""
    if not operators:
        return False
    try:
        _Judge(fence_of, columns, operators).walk(stmt)
    except _Leaky:
        return False
    return True


class _Leaky(Exception):
    pass


# alias -> the plain (unmasked) exposed columns and their types; None: a from-item of unknown columns
_Scope = dict[str, dict[str, str] | None]


class _Judge:
    def __init__(self, fence_of: FenceOf, columns: ColumnTypes, operators: LeakproofOperators) -> None:
        self.fence_of = fence_of
        self.columns = columns
        self.operators = operators

    def walk(self, value: object) -> None:
        """Every SelectStmt below `value`, a narrowing's own subquery excepted."""
        if isinstance(value, list):
            for item in value:
                self.walk(item)
            return
        if not isinstance(value, dict):
            return
        for kind, fields in value.items():
            if (
                kind == "RangeSubselect"
                and isinstance(fields, dict)
                and self.fence_of(fields.get("subquery")) is not None
            ):
                continue
            if kind == "SelectStmt" and isinstance(fields, dict):
                self._level(fields)
            self.walk(fields)

    def _level(self, fields: Mapping[str, Any]) -> None:
        scope: _Scope = {}
        quals: list[object] = []
        for item in fields.get("fromClause") or ():
            self._from_item(item, scope, quals)
        for key in ("whereClause", "havingClause"):
            if fields.get(key) is not None:
                quals.append(fields[key])
        for qual in quals:
            self._qual(qual, scope)

    def _from_item(self, item: object, scope: _Scope, quals: list[object]) -> None:
        if not isinstance(item, dict) or len(item) != 1:
            raise _Leaky
        ((kind, fields),) = item.items()
        if kind == "JoinExpr":
            if fields.get("usingClause") or fields.get("isNatural") or fields.get("alias"):
                raise _Leaky  # an implicit equality, or a join alias: not typed here
            if fields.get("join_using_alias"):
                raise _Leaky
            self._from_item(fields.get("larg"), scope, quals)
            self._from_item(fields.get("rarg"), scope, quals)
            if fields.get("quals") is not None:
                quals.append(fields["quals"])
            return
        alias = (fields.get("alias") or {}).get("aliasname") if isinstance(fields, dict) else None
        if kind == "RangeSubselect":
            table = self.fence_of(fields.get("subquery"))
            if not isinstance(alias, str):
                raise _Leaky
            scope[alias] = None if table is None else self._plain(fields["subquery"], table)
            return
        if kind == "RangeVar":  # a CTE's name (pg_verify refuses any other relation)
            scope[alias if isinstance(alias, str) else str(fields.get("relname"))] = None
            return
        raise _Leaky

    def _plain(self, subquery: Mapping[str, Any], table: str) -> dict[str, str]:
        """The columns a narrowing passes through as they are: a masked one is an expression,
        which PostgreSQL would evaluate wherever it pushes the caller's qual."""
        types = self.columns.get(table, {})
        out: dict[str, str] = {}
        for target in subquery.get("SelectStmt", {}).get("targetList") or ():
            res = target.get("ResTarget", {}) if isinstance(target, dict) else {}
            ref = (res.get("val") or {}).get("ColumnRef")
            if not isinstance(ref, dict):
                continue
            if ref.get("fields") == [{"A_Star": {}}]:  # a dataset without a `columns:` list
                out.update(types)
                continue
            names = [f.get("String", {}).get("sval") if isinstance(f, dict) else None for f in ref["fields"]]
            column = names[1] if len(names) == 2 and names[0] == RF_ALIAS else None
            if isinstance(column, str) and res.get("name") in (None, column) and column in types:
                out[column] = types[column]
        return out

    # ------------------------------------------------------------------ a qual's parts
    def _qual(self, node: object, scope: _Scope) -> None:
        if not isinstance(node, dict) or len(node) != 1:
            raise _Leaky
        ((kind, fields),) = node.items()
        if kind == "BoolExpr":
            for arg in fields.get("args") or ():
                self._qual(arg, scope)
        elif kind in ("NullTest", "BooleanTest"):
            self._operand(fields.get("arg"), scope)
        elif kind == "ColumnRef":
            if self._column(fields, scope) != "boolean":
                raise _Leaky
        elif kind == "A_Const":
            if "boolval" not in fields and not fields.get("isnull"):
                raise _Leaky
        elif kind == "A_Expr":
            self._comparison(fields, scope)
        else:
            raise _Leaky

    def _comparison(self, fields: Mapping[str, Any], scope: _Scope) -> None:
        kind = fields.get("kind")
        names = fields.get("name") or []
        named = len(names) == 1 and isinstance(names[0], dict)
        op = names[0].get("String", {}).get("sval") if named else None
        left = self._operand(fields.get("lexpr"), scope)
        rexpr = fields.get("rexpr")
        if kind == "AEXPR_OP" and op in COMPARISONS:
            self._operator(str(op), left, self._operand(rexpr, scope))
            return
        items = (rexpr or {}).get("List", {}).get("items") if isinstance(rexpr, dict) else None
        if not isinstance(items, list) or not items:
            raise _Leaky
        rights = [self._operand(item, scope) for item in items]
        if kind == "AEXPR_IN" and op in ("=", "<>"):
            pairs = [(str(op), r) for r in rights]
        elif kind == "AEXPR_BETWEEN" and len(rights) == 2:
            pairs = [(">=", rights[0]), ("<=", rights[1])]
        elif kind == "AEXPR_NOT_BETWEEN" and len(rights) == 2:
            pairs = [("<", rights[0]), (">", rights[1])]
        else:
            raise _Leaky
        for name, right in pairs:
            self._operator(name, left, right)

    def _operator(self, op: str, left: str, right: str) -> None:
        if left == _UNKNOWN and right == _UNKNOWN:
            raise _Leaky
        if left == _UNKNOWN:
            left = right
        elif right == _UNKNOWN:
            right = left
        if (op, left, right) not in self.operators:
            raise _Leaky

    def _operand(self, node: object, scope: _Scope) -> str:
        """The operand's type: a plain column's, or a constant's as PostgreSQL types it."""
        if not isinstance(node, dict) or len(node) != 1:
            raise _Leaky
        ((kind, fields),) = node.items()
        if kind == "ColumnRef":
            return self._column(fields, scope)
        if kind == "A_Const":
            return _const_type(fields)
        raise _Leaky

    def _column(self, fields: Mapping[str, Any], scope: _Scope) -> str:
        parts = fields.get("fields") or []
        names = [p.get("String", {}).get("sval") if isinstance(p, dict) else None for p in parts]
        if not all(isinstance(n, str) for n in names):
            raise _Leaky
        if len(names) == 2:
            known = scope.get(str(names[0]))
        elif len(names) == 1 and len(scope) == 1:
            known = next(iter(scope.values()))
        else:
            raise _Leaky
        found = known.get(str(names[-1])) if known is not None else None
        if found is None:
            raise _Leaky
        return found


def _const_type(fields: Mapping[str, Any]) -> str:
    if "sval" in fields or fields.get("isnull"):
        return _UNKNOWN
    if "boolval" in fields:
        return "boolean"
    if "ival" in fields:
        return "integer"
    raw = (fields.get("fval") or {}).get("fval")
    if isinstance(raw, str) and raw.lstrip("-").isdigit():
        value = int(raw)
        return "integer" if -_INT4 <= value < _INT4 else "bigint" if -_INT8 <= value < _INT8 else "numeric"
    return "numeric"
