"""Statement validation and dataset resolution (docs/gateway.md), cached by text."""

from __future__ import annotations

import re
import threading

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError

from dataplane_contracts.catalogue import Catalogue
from dataplane_contracts.errors import ErrorCode
from dataplane_service_kit.bounded_cache import BoundedCache
from dataplane_service_kit.errors import ServiceError
from query_gateway.sql import rules
from query_gateway.sql.model import ValidatedQuery
from query_gateway.sql.scope import DIALECT, table_parts, table_refs, walk_tables

CACHE_SIZE = 1024

# keyword "functions" PostgreSQL evaluates without parentheses; sqlglot reads them as columns
_BARE_FUNCTIONS = frozenset(
    {"current_user", "session_user", "user", "current_role", "current_schema", "current_catalog"}
)
_WRITES: tuple[type[exp.Expr], ...] = (
    exp.Insert,
    exp.Update,
    exp.Delete,
    exp.Merge,
    exp.Create,
    exp.Drop,
    exp.Alter,
    exp.Command,
)


class _Refusal(Exception):
    def __init__(self, code: ErrorCode, detail: str) -> None:
        super().__init__(detail)
        self.code: ErrorCode = code
        self.detail = detail


_cache: BoundedCache[tuple[str, int], tuple[Catalogue, ValidatedQuery | _Refusal]] = BoundedCache(CACHE_SIZE)
_cache_lock = threading.Lock()  # the app may validate from a worker thread


def validate_query(sql: str, catalogue: Catalogue) -> ValidatedQuery:
    """docs/gateway.md, "SQL rules"; raises ServiceError sql_refused / unknown_dataset / ambiguous_dataset."""
    return analyse(sql, catalogue)


def analyse(sql: str, catalogue: Catalogue) -> ValidatedQuery:
    """`validate_query`, the same object for the same text and catalogue while it is cached."""
    key = (sql, id(catalogue))
    with _cache_lock:
        hit = _cache.get(key)
    # the entry holds the catalogue itself, so its id cannot be reused while the entry lives
    if hit is not None and hit[0] is catalogue:
        outcome = hit[1]
    else:
        try:
            outcome = _analyse(sql, catalogue)
        except _Refusal as refusal:
            outcome = refusal
        with _cache_lock:
            _cache.put(key, (catalogue, outcome))
    if isinstance(outcome, _Refusal):
        raise ServiceError(outcome.code, outcome.detail)
    return outcome


def _refuse(detail: str) -> _Refusal:
    return _Refusal("sql_refused", detail)


def _analyse(sql: str, catalogue: Catalogue) -> ValidatedQuery:
    if not sql or not sql.strip():
        raise _refuse("Empty SQL query")
    body = re.sub(r"[\s;]+$", "", sql)
    if ";" in body:
        raise _refuse("Multiple SQL statements are not allowed")
    if "--" in body or "/*" in body:
        raise _refuse("SQL comments are not allowed")
    root = _parse(body)
    _check_root(root)
    if rules.depth_of(root) > rules.MAX_DEPTH:
        raise _refuse(f"Query too complex, max depth limit is {rules.MAX_DEPTH}")
    for node in root.walk():
        _check_node(node)
    ids = _resolve_all(root, catalogue)
    return ValidatedQuery(text=sql, dataset_ids=ids, tree=root, catalogue=catalogue)


def _parse(body: str) -> exp.Select:
    try:
        statements = sqlglot.parse(body, read=DIALECT)
    except ParseError as err:
        # the position only: sqlglot's description quotes the statement (a token's repr holds its
        # text, which may be a personal value) and names its own classes; the detail is fixed
        first = err.errors[0] if err.errors else {}
        line, col = first.get("line"), first.get("col")
        where = f" at line {line}, column {col}" if isinstance(line, int) and isinstance(col, int) else ""
        raise _refuse(f"Invalid SQL syntax{where}") from None
    except Exception:
        raise _refuse("Invalid SQL query") from None
    if len(statements) != 1 or statements[0] is None:
        raise _refuse("Multiple SQL statements are not allowed")
    root = statements[0]
    if isinstance(root, rules.REFUSED_CONSTRUCTS):
        raise _refuse(f"SQL construct not allowed: {type(root).__name__}")
    if isinstance(root, _WRITES):
        raise _refuse(f"Disallowed SQL operation: {type(root).__name__}")
    if not isinstance(root, exp.Select):
        raise _refuse("Only a SELECT statement is allowed")
    return root


def _check_root(root: exp.Select) -> None:
    if not root.expressions:
        raise _refuse("Query must select something")
    if any(root.args.get(k) for k in ("limit", "offset", "fetch")):
        raise _refuse("LIMIT not allowed in top-level query")


def _check_node(node: exp.Expr) -> None:
    name = type(node).__name__
    if isinstance(node, rules.REFUSED_CONSTRUCTS):
        raise _refuse(f"SQL construct not allowed: {name}")
    if isinstance(node, _WRITES):
        raise _refuse(f"Disallowed SQL operation: {name}")
    if isinstance(node, exp.Lock):
        raise _refuse("Locking clauses (FOR UPDATE/SHARE) are not allowed")
    if isinstance(node, exp.Into):
        raise _refuse("SELECT INTO is not allowed")
    if isinstance(node, exp.TableSample):
        raise _refuse("TABLESAMPLE is not allowed")
    if isinstance(node, exp.ObjectIdentifier) or (
        isinstance(node, exp.DataType) and node.this == exp.DataType.Type.USERDEFINED
    ):
        # reg* casts read the system catalogs; other types are the database's, not the SQL's
        raise _refuse(f"Cast to this type is not allowed: {node.sql(DIALECT)}")
    if isinstance(node, exp.Identifier) and str(node.this).lower().startswith(rules.RESERVED_PREFIX):
        raise _refuse(f"Identifiers starting with {rules.RESERVED_PREFIX} are reserved")
    if isinstance(node, exp.Table):
        _check_table(node)
    elif isinstance(node, exp.Lateral) and not isinstance(node.this, exp.Subquery):
        raise _refuse("LATERAL is allowed only on a subquery")
    elif isinstance(node, exp.With) and node.args.get("recursive"):
        raise _refuse("Recursive CTEs are not allowed")
    elif isinstance(node, exp.Column) and _is_bare_function(node):
        raise _refuse(f"SQL function not allowed: {node.name}")
    elif (
        isinstance(node, exp.EQ)
        and node.this.sql() == node.expression.sql()
        and node.find_ancestor(exp.Or) is not None
    ):
        raise _refuse("Tautological predicate in OR context is not allowed")
    if isinstance(node, exp.Neg):
        if not (isinstance(node.this, exp.Literal) and not node.this.is_string):
            raise _refuse("Unary minus is allowed only on a numeric literal")
        return
    if isinstance(node, rules.ALLOWED_NODES):
        return
    if isinstance(node, exp.Func):
        if rules.function_allowed(node):
            return
        fname = str(node.this) if isinstance(node, exp.Anonymous) else node.sql_names()[0]
        if rules.unbounded_generator(node):
            raise _refuse(
                f"Set-returning function not allowed (unbounded rows): {rules.postgres_name(fname)}"
            )
        raise _refuse(f"SQL function not allowed: {fname.upper()}")
    raise _refuse(f"Unsupported SQL construct: {name}")


def _check_table(table: exp.Table) -> None:
    if table.args.get("only"):
        raise _refuse("ONLY is not allowed")
    if table.args.get("sample"):
        raise _refuse("TABLESAMPLE is not allowed")
    extra = sorted(k for k, v in table.args.items() if v and k not in rules.TABLE_ARGS)
    if extra:
        raise _refuse(f"Unsupported table clause: {extra[0]}")
    try:
        table_parts(table)
    except ValueError:
        raise _refuse("Table functions are not allowed") from None


def _is_bare_function(col: exp.Column) -> bool:
    ident = col.this
    return (
        isinstance(ident, exp.Identifier)
        and not ident.quoted
        and not col.table
        and ident.name.lower() in _BARE_FUNCTIONS
    )


def _resolve_all(root: exp.Select, catalogue: Catalogue) -> tuple[str, ...]:
    ids: set[str] = set()
    unknown: set[str] = set()
    for table, is_cte in walk_tables(root):
        if is_cte:
            continue
        folded, raw = table_refs(table)
        first = folded.split(".")[0]
        if first in rules.SYSTEM_SCHEMAS or folded.split(".")[-1].startswith("pg_"):
            raise _refuse("System catalogs are not allowed")
        found = resolve_reference(folded, raw, catalogue)
        if found is None:
            unknown.add(raw)
        else:
            ids.add(found)
    if unknown:
        raise _Refusal("unknown_dataset", f"Query references unknown datasets: {sorted(unknown)}")
    if not ids:
        raise _refuse("Query references no datasets")
    return tuple(sorted(ids))


def resolve_reference(folded: str, raw: str, catalogue: Catalogue) -> str | None:
    """docs/gateway.md, "Dataset resolution": the exact id (as PostgreSQL folds it, or as written);
    else, for a reference with exactly one dot, the one id ending in `.<ref>`. More than one
    candidate is ambiguous."""
    ids = [d.id for d in catalogue.datasets]
    exact = sorted({i for i in ids if i in (folded, raw)})
    if not exact and raw.count(".") == 1:
        exact = sorted({i for i in ids if i.endswith("." + folded) or i.endswith("." + raw)})
    if len(exact) > 1:
        raise _Refusal("ambiguous_dataset", f"Query reference {raw} is ambiguous; use the full dataset id")
    return exact[0] if exact else None
