"""Narrowing every real table reference to its permitted rows (docs/row-filters.md, "How a statement is
narrowed"), then proving it on a fresh parse of the result (verify.py) before anything runs."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sqlglot import exp

from dataplane_contracts.catalogue import Catalogue, DatasetEntry
from dataplane_contracts.plans import Plan
from dataplane_service_kit.bounded_cache import BoundedCache
from dataplane_service_kit.errors import ServiceError
from query_gateway.sql import pg_verify
from query_gateway.sql.columns import cast_for, convert_values
from query_gateway.sql.exposure import (
    MASK_KEY_LABELS,
    MaskKey,
    dataset_columns,
    fence_column,
    fence_projection,
    rendered,
)
from query_gateway.sql.leakproof import LeakproofOperators
from query_gateway.sql.model import ColumnTypes, DatasetColumns, NarrowedQuery, ValidatedQuery
from query_gateway.sql.pagination import outer_order_by
from query_gateway.sql.references import check_references
from query_gateway.sql.scope import DIALECT, fold, table_parts, table_refs, walk_tables
from query_gateway.sql.validate import resolve_reference
from query_gateway.sql.verify import RF_ALIAS, Expected, is_true, order_list, verify_narrowed


def physical_table(entry: DatasetEntry) -> exp.Table:
    """The catalogue's `[schema.]name`, parsed with PostgreSQL's quoting and case rules."""
    try:
        table = exp.to_table(entry.table, dialect=DIALECT)
    except Exception:
        table = None
    if not isinstance(table, exp.Table) or len(table_parts(table)) > 2:
        raise ServiceError("sql_refused", f"dataset {entry.id}: physical table is not [schema.]name")
    return table


def physical_key(table: exp.Table) -> tuple[str, ...]:
    return tuple(fold(p) for p in table_parts(table))


def _predicate(column: str, pg_type: str, index: int) -> exp.Expr:
    elem, native = cast_for(pg_type)
    col = fence_column(column)
    lhs: exp.Expr = col if native else exp.cast(col, "text", dialect=DIALECT)
    array = exp.cast(exp.Parameter(this=exp.Literal.number(index)), f"{elem}[]", dialect=DIALECT)
    return exp.EQ(this=lhs, expression=exp.Any(this=exp.Paren(this=array)))


def _label(plan: Plan, dataset_id: str, column: str, count: int) -> str:
    base = plan.meta.label or f"{dataset_id} {column} values"
    return f"{base} ({count} value{'s' if count != 1 else ''})"


# A narrowed statement depends on the text, the catalogue (its column exposure among it), whether
# it is a deny, and for each dataset the (column, type) of each allow-list — never on the values,
# which are bound parameters, nor on the mask key, bound too. So the rewrite and its verification
# run once per shape, not once per request.
NarrowShape = tuple[tuple[str, tuple[tuple[str, str], ...]], ...]


@dataclass(frozen=True)
class _Rewritten:
    sql: str
    order_by: str
    masked: bool  # a fence computes a `hash` mask: the mask key is bound after the allow-lists
    exposure: tuple[DatasetColumns, ...]  # of the statement's datasets, for `POST /query/plan`
    fences: tuple[tuple[str, str], ...]  # (catalogue table, narrowing SELECT) per dataset (QE-12)
    fence_types: tuple[tuple[str, tuple[tuple[str, str], ...]], ...]  # each fenced table's columns


CACHE_SIZE = 1024
_CacheKey = tuple[str, int, bool, NarrowShape, LeakproofOperators]
_cache: BoundedCache[_CacheKey, tuple[Catalogue, _Rewritten]] = BoundedCache(CACHE_SIZE)
_cache_lock = threading.Lock()


def narrow_query(
    q: ValidatedQuery,
    catalogue: Catalogue,
    plans: Mapping[str, Sequence[Plan]],
    columns: ColumnTypes,
    mask_key: MaskKey | None = None,
    *,
    leakproof: LeakproofOperators = frozenset(),
) -> NarrowedQuery:
    """Every real table reference becomes `(SELECT <exposed> FROM schema.table AS _dp_rf WHERE
    <pred> OFFSET 0) alias`, a barrier (see `_narrowed`) listing exactly the dataset's exposed
    columns (`*` without a `columns:` list). A deny — a `deny` plan, or an allow-list none of
    whose values converts — puts FALSE into every SELECT. `leakproof`: the database's leakproof
    comparison operators (leakproof.py); without them every filtered narrowing is fenced. Raises
    ServiceError("sql_refused") when anything cannot be proven, ServiceError("column_not_exposed")
    for a column it cannot reach."""
    entries = catalogue.by_id()
    params: list[object] = []
    labels: list[str] = []
    shape: list[tuple[str, tuple[tuple[str, str], ...]]] = []
    denied = False
    for ds_id in q.dataset_ids:
        if ds_id not in plans:
            raise ServiceError("sql_refused", f"no row policy was resolved for dataset {ds_id}")
        entry = entries[ds_id]
        specs: list[tuple[str, str]] = []
        for plan in plans[ds_id]:
            if plan.kind == "all":
                continue
            if plan.kind == "deny" or plan.column is None:
                denied = True
                continue
            pg_type = columns.get(entry.table, {}).get(plan.column)
            if pg_type is None:
                raise ServiceError("sql_refused", f"dataset {ds_id}: filter column type unknown")
            values = convert_values(plan.values, pg_type)
            if not values:  # RF-05: nothing left to allow is a deny, never IN ()
                denied = True
                continue
            params.append(values)
            labels.append(_label(plan, ds_id, plan.column, len(values)))
            specs.append((plan.column, pg_type))
        shape.append((ds_id, tuple(specs)))
    if denied:  # nothing is read, so nothing needs binding
        params, labels = [], []
    rewritten = _narrowed_sql(q, catalogue, columns, denied, tuple(shape), leakproof=leakproof)
    if rewritten.masked:
        if mask_key is None:  # start-up requires the key with a hash mask; a library caller may not
            raise ServiceError("sql_refused", "a column is masked by hash, and no mask key is configured")
        params.extend(mask_key.params)
        labels.extend(MASK_KEY_LABELS)
    return NarrowedQuery(
        sql=rewritten.sql,
        params=tuple(params),
        param_labels=tuple(labels),
        denied=denied,
        order_by=rewritten.order_by,
        exposure=rewritten.exposure,
        fences=rewritten.fences,
        fence_types=rewritten.fence_types,
        leakproof=leakproof,
    )


def _narrowed_sql(
    q: ValidatedQuery,
    catalogue: Catalogue,
    columns: ColumnTypes,
    denied: bool,
    shape: NarrowShape,
    *,
    leakproof: LeakproofOperators,
) -> _Rewritten:
    key = (q.text, id(catalogue), denied, shape, leakproof)
    with _cache_lock:
        hit = _cache.get(key)
        # the entry holds the catalogue itself, so its id cannot be reused while the entry lives
        if hit is not None and hit[0] is catalogue:
            return hit[1]
    narrowed = _rewrite(q, catalogue, columns, denied, shape, leakproof=leakproof)
    with _cache_lock:
        _cache.put(key, (catalogue, narrowed))
    return narrowed


def _rewrite(
    q: ValidatedQuery,
    catalogue: Catalogue,
    columns: ColumnTypes,
    denied: bool,
    shape: NarrowShape,
    *,
    leakproof: LeakproofOperators,
) -> _Rewritten:
    """The narrowed statement for one shape, proven on a fresh parse, and its outer ORDER BY."""
    if q.catalogue is not catalogue:
        # its names were resolved against another catalogue (one read again since): not this one's
        raise ServiceError("sql_refused", "statement does not match its validation")
    check_references(q.tree, catalogue, columns)  # on the caller's tree: its names
    entries = catalogue.by_id()
    n_params = 0
    preds: dict[str, exp.Expr] = {}
    for ds_id, specs in shape:
        conds: list[exp.Expr] = []
        for column, pg_type in specs:
            n_params += 1
            conds.append(_predicate(column, pg_type, n_params))
        preds[ds_id] = exp.false() if denied else (exp.and_(*conds) if conds else exp.true())
    if denied:
        n_params = 0
    # the mask key's two parameters follow the allow-lists', shared by every fence that hashes
    exposure = {ds_id: dataset_columns(entries[ds_id], columns) for ds_id, _ in shape}
    masked = not denied and any(exposure[ds_id].hashes for ds_id, _ in shape)
    fences = {
        ds_id: fence_projection(
            exposure[ds_id], columns, entries[ds_id].table, denied=denied, key_param=n_params + 1
        )
        for ds_id, _ in shape
    }
    build = _Build(q, catalogue, preds, fences, denied)
    types = tuple((entries[d].table, tuple(columns.get(entries[d].table, {}).items())) for d, _ in shape)
    done = build.narrowed(barrier=True, carried=None)
    if not denied and not all(is_true(p) for p in preds.values()):
        # one table read: with two or more, each fenced side is planned alone, which on the bench
        # beat PostgreSQL's plan of the unfenced join fourteenfold (a merge join over repeated
        # keys on a misestimate, bench/README.md): what may go unfenced is kept to one read
        single = sum(1 for _, is_cte in walk_tables(q.tree) if not is_cte) == 1
        if single and pg_verify.statement_leakproof(done.sql, done.built, types, leakproof):
            done = build.narrowed(barrier=False, carried=None)
        else:
            carried = _carried_order(q.tree, catalogue, exposure)
            if carried is not None:
                done = build.narrowed(barrier=True, carried=carried)
    verify_narrowed(
        done.sql,
        done.expected,
        denied=denied,
        n_params=n_params + (2 if masked else 0),
        unfenced=not done.barrier,
        orders=frozenset(done.orders),
    )
    # the rewrite replaces table references only, so the top-level ORDER BY is the caller's own
    return _Rewritten(
        done.sql,
        outer_order_by(q.tree),
        masked,
        tuple(exposure[ds_id] for ds_id, _ in shape),
        tuple(done.built),
        types,
    )


@dataclass(frozen=True)
class _Narrowing:
    sql: str
    built: list[tuple[str, str]]  # each narrowing: (catalogue table, its SELECT)
    expected: Expected  # what the verifier must find at each physical table
    orders: set[tuple[tuple[str, ...], str]]  # the ORDER BY carried into a fence of that table
    barrier: bool


@dataclass(frozen=True)
class _Build:
    q: ValidatedQuery
    catalogue: Catalogue
    preds: Mapping[str, exp.Expr]
    fences: Mapping[str, list[exp.Expr] | None]
    denied: bool

    def narrowed(self, *, barrier: bool, carried: tuple[int, exp.Order] | None) -> _Narrowing:
        """The statement with every table reference narrowed, with or without the barrier;
        `carried`: (the caller's table node, the ORDER BY its fence carries)."""
        entries = self.catalogue.by_id()
        tree = self.q.tree.copy()
        if self.denied:
            for select in list(tree.find_all(exp.Select)):
                select.where(exp.false(), append=True, copy=False)
        # the copy's table nodes beside the caller's, in the same walk: `carried` names the caller's
        pairs = list(zip(list(walk_tables(tree)), [t for t, _ in walk_tables(self.q.tree)], strict=True))
        built: list[tuple[str, str]] = []
        expected: Expected = {}
        orders: set[tuple[tuple[str, ...], str]] = set()
        for (table, is_cte), source in pairs:
            if is_cte:
                continue
            folded, raw = table_refs(table)
            found = resolve_reference(folded, raw, self.catalogue)
            if found is None or found not in self.preds:
                raise ServiceError("sql_refused", "a table reference could not be narrowed")
            entry, pred = entries[found], self.preds[found]
            order = carried[1] if carried is not None and carried[0] == id(source) else None
            sub = _narrowed(table, entry, pred, self.fences[found], barrier=barrier, order=order)
            table.replace(sub)
            text = sub.this.sql(dialect=DIALECT)
            if (entry.table, text) not in built:
                built.append((entry.table, text))
            key = physical_key(physical_table(entry))
            expected.setdefault(key, set()).add((pred.sql(dialect=DIALECT), rendered(self.fences[found])))
            if order is not None:
                orders.add((key, order_list(text)))
        return _Narrowing(tree.sql(dialect=DIALECT), built, expected, orders, barrier)


def _carried_order(
    tree: exp.Select, catalogue: Catalogue, exposure: Mapping[str, DatasetColumns]
) -> tuple[int, exp.Order] | None:
    """Where the statement reads one narrowed reference at its top level, the caller's ORDER BY
    (else its GROUP BY) when every key is a plain exposed column of that reference: carried inside
    the fence, it lets the table's index order reach the caller's grouping and sorting. The keys
    name the fence's own columns only; a masked one (an expression) or an output alias is not
    carried."""
    from_ = tree.args.get("from_") or tree.args.get("from")
    if tree.args.get("joins") or not isinstance(from_, exp.From) or not isinstance(from_.this, exp.Table):
        return None
    table = from_.this
    if any(t is table and is_cte for t, is_cte in walk_tables(tree)):
        return None
    folded, raw = table_refs(table)
    found = resolve_reference(folded, raw, catalogue)
    if found is None or found not in exposure:
        return None
    alias = table.args.get("alias")
    name = alias.this if isinstance(alias, exp.TableAlias) and alias.this else table_parts(table)[-1]
    qualifier = fold(name) if isinstance(name, exp.Identifier) else None
    plain = {n for n, mask in exposure[found].columns if mask is None}
    outputs = {fold(e.args["alias"]) for e in tree.expressions if isinstance(e, exp.Alias)}

    def key(node: object) -> str | None:
        if not isinstance(node, exp.Column) or not isinstance(node.this, exp.Identifier):
            return None
        if node.args.get("db") or node.args.get("catalog"):
            return None
        owner = node.args.get("table")
        if owner is not None and (not isinstance(owner, exp.Identifier) or fold(owner) != qualifier):
            return None
        column = fold(node.this)
        return column if column in plain and column not in outputs else None

    order, group = tree.args.get("order"), tree.args.get("group")
    items: list[exp.Ordered] = []
    if isinstance(order, exp.Order) and order.expressions:
        for o in order.expressions:
            column = key(o.this) if isinstance(o, exp.Ordered) else None
            if column is None:
                items = []
                break
            items.append(
                exp.Ordered(
                    this=fence_column(column), desc=o.args.get("desc"), nulls_first=o.args.get("nulls_first")
                )
            )
    if not items and isinstance(group, exp.Group) and group.expressions:
        for g in group.expressions:
            column = key(g)
            if column is None:
                return None
            items.append(exp.Ordered(this=fence_column(column), nulls_first=False))
    return (id(table), exp.Order(expressions=items)) if items else None


def _narrowed(
    table: exp.Table,
    entry: DatasetEntry,
    pred: exp.Expr,
    projection: list[exp.Expr] | None,
    *,
    barrier: bool = True,
    order: exp.Order | None = None,
) -> exp.Subquery:
    """The narrowing subquery of one table reference.

    A plain subquery is pulled up by PostgreSQL into the query around it, and the quals of one
    scan are then ordered by estimated cost: a cheap predicate of the caller's can run on a row
    *before* the filter rejects it, and a predicate that raises on one value turns the error into
    an answer about a row the caller may not read. `OFFSET 0` keeps the subquery a planning unit
    of its own — never pulled up, no qual pushed into it — so every row the caller's SQL sees has
    passed the filter (the guarantee of PostgreSQL's security_barrier views). A predicate
    of TRUE hides no row, so there is nothing to fence and the caller's predicates keep the
    table's indexes; nor does a statement whose every qual is leakproof (`barrier` False,
    leakproof.py). Where it fences, `order` (a plain exposed column list) keeps the index order
    the caller's grouping or sorting needs, which a barrier would otherwise lose.

    The select list is the dataset's exposure (`projection`; None: `*`): a column it leaves out
    exists for no expression above the subquery, whatever the caller writes."""
    source = physical_table(entry)
    source.set("alias", exp.TableAlias(this=exp.to_identifier(RF_ALIAS)))
    listed = [p.copy() for p in projection] if projection is not None else [exp.Star()]
    inner = exp.Select(expressions=listed).from_(source, copy=False).where(pred.copy(), copy=False)
    if barrier and not is_true(pred):
        if order is not None:
            inner.set("order", order.copy())
        inner.set("offset", exp.Offset(expression=exp.Literal.number(0)))
    alias = table.args.get("alias")
    if not isinstance(alias, exp.TableAlias):
        # unaliased, the statement refers to the table by its last name part: keep that name
        alias = exp.TableAlias(this=table_parts(table)[-1].copy())
    return exp.Subquery(this=inner, alias=alias.copy())
