"""The post-rewrite check: on a fresh parse of the rewritten text, every table read must be the
inner table of a narrowing subquery carrying its dataset's predicate and select list (exactly its
exposed columns and masks, or `*` when the dataset has no `columns:` list) and, unless that
predicate is TRUE or the statement's every qual is leakproof (`unfenced`, judged on PostgreSQL's
own tree: leakproof.py), the `OFFSET 0` barrier that keeps the caller's predicates from seeing a
row the filter rejects; inside a barrier, at most the ORDER BY the rewrite carried there, of the
fence's own plain columns; a deny must have FALSE in every SELECT; every bound parameter must sit in such a
predicate or select list. Anything else is refused."""

from __future__ import annotations

import sqlglot
from sqlglot import exp

from dataplane_service_kit.errors import ServiceError
from query_gateway.sql.scope import DIALECT, fold, table_parts, walk_tables

RF_ALIAS = "_dp_rf"  # reserved: validation refuses every `_dp_` identifier in a statement


def _fail(why: str) -> ServiceError:
    return ServiceError("sql_refused", f"the narrowed statement failed verification: {why}")


Expected = dict[tuple[str, ...], set[tuple[str, str]]]


def verify_narrowed(
    sql: str,
    expected: Expected,
    *,
    denied: bool,
    n_params: int,
    unfenced: bool = False,
    orders: frozenset[tuple[tuple[str, ...], str]] = frozenset(),
) -> None:
    """`expected`: physical table → the (predicate, select list) pairs of its datasets, as a fresh
    parse renders them; a read must carry one pair whole. `unfenced`: the statement needs no
    barrier; `orders`: (physical table, ORDER BY) a fence of that table may carry."""
    try:
        tree = sqlglot.parse_one(sql, read=DIALECT)
    except Exception:
        raise _fail("not parseable") from None
    if not isinstance(tree, exp.Select):
        raise _fail("not a SELECT")
    guarded: list[exp.Expr] = []
    for table, is_cte in walk_tables(tree):
        alias = table.alias
        if is_cte:
            if alias.lower() == RF_ALIAS:
                raise _fail("a narrowing reads a CTE")  # a CTE shadows the physical table
            continue
        key = tuple(fold(p) for p in table_parts(table))
        if key not in expected:
            raise _fail("a table read is not catalogued")
        if alias != RF_ALIAS:
            raise _fail("a table read is not narrowed")
        from_ = table.parent
        select = from_.parent if from_ is not None else None
        if not isinstance(from_, exp.From) or not isinstance(select, exp.Select):
            raise _fail("a table read is not narrowed")
        where = select.args.get("where")
        extra = [
            k
            for k, v in select.args.items()
            if v and k not in ("expressions", "from_", "from", "where", "offset", "order")
        ]
        fenced = _is_barrier(select.args.get("offset"))
        if (
            extra
            or (select.args.get("offset") is not None and not fenced)
            or not isinstance(where, exp.Where)
            or (not fenced and not unfenced and not is_true(where.this))
            or not isinstance(select.parent, exp.Subquery)
        ):
            raise _fail("a table read does not carry its predicate")
        order = select.args.get("order")
        if order is not None and (
            not fenced or not _plain_order(order, select) or (key, order_list(select)) not in orders
        ):
            raise _fail("a narrowing carries an order the rewrite did not put there")
        if (where.this.sql(dialect=DIALECT), select_list(select)) not in expected[key]:
            raise _fail("a table read does not carry its predicate and exposed columns")
        guarded.append(where)
        guarded.extend(select.expressions)
    if denied:
        for select in tree.find_all(exp.Select):
            cond = select.args.get("where")
            cond = cond.this if isinstance(cond, exp.Where) else None
            if not _is_false(cond):
                raise _fail("a SELECT of a denied statement can read rows")
    numbers: set[int] = set()
    inside = {id(node) for node in guarded}
    for param in tree.find_all(exp.Parameter, exp.Placeholder):
        if not any(id(up) in inside for up in _ancestors(param)):
            raise _fail("a parameter outside a narrowing predicate or select list")
        numbers.add(int(param.name) if param.name.isdigit() else -1)
    if numbers != set(range(1, n_params + 1)):
        raise _fail("parameters do not match the allow-lists")


def select_list(select: exp.Expr) -> str:
    """A SELECT's list as the verifier compares it with a fence's expected columns."""
    return ", ".join(p.sql(dialect=DIALECT) for p in select.expressions)


def order_list(select: exp.Expr | str) -> str:
    """A narrowing's ORDER BY as the verifier compares it ('' for none); a text is parsed first."""
    if isinstance(select, str):
        select = sqlglot.parse_one(select, read=DIALECT)
    order = select.args.get("order")
    return order.sql(dialect=DIALECT) if isinstance(order, exp.Order) else ""


def _plain_order(order: exp.Expr, select: exp.Select) -> bool:
    """Every key a column of the fence's table the select list passes through as it is."""
    listed = {p.sql(dialect=DIALECT) for p in select.expressions if isinstance(p, exp.Column)}
    star = any(isinstance(p, exp.Star) for p in select.expressions)
    for item in order.expressions if isinstance(order, exp.Order) else [None]:
        column = item.this if isinstance(item, exp.Ordered) else None
        if not isinstance(column, exp.Column) or column.table != RF_ALIAS:
            return False
        if not star and column.sql(dialect=DIALECT) not in listed:
            return False
    return True


def _ancestors(node: exp.Expr) -> list[exp.Expr]:
    out = []
    parent = node.parent
    while parent is not None:
        out.append(parent)
        parent = parent.parent
    return out


def is_true(cond: exp.Expr | None) -> bool:
    """A predicate that admits every row: the only narrowing that needs no barrier."""
    return isinstance(cond, exp.Boolean) and cond.this is True


def _is_barrier(offset: object) -> bool:
    """`OFFSET 0` and nothing else: a literal zero, no parameter, no expression."""
    if not isinstance(offset, exp.Offset):
        return False
    value = offset.expression
    return isinstance(value, exp.Literal) and not value.is_string and value.name == "0"


def _is_false(cond: exp.Expr | None) -> bool:
    if isinstance(cond, exp.Boolean):
        return cond.this is False
    if isinstance(cond, exp.And):
        return _is_false(cond.expression) or _is_false(cond.this)
    if isinstance(cond, exp.Paren):
        return _is_false(cond.this)
    return False
