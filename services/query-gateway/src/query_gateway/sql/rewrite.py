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
from query_gateway.sql.columns import cast_for, convert_values
from query_gateway.sql.exposure import (
    MASK_KEY_LABELS,
    MaskKey,
    dataset_columns,
    fence_column,
    fence_projection,
    rendered,
)
from query_gateway.sql.model import ColumnTypes, DatasetColumns, NarrowedQuery, ValidatedQuery
from query_gateway.sql.pagination import outer_order_by
from query_gateway.sql.references import check_references
from query_gateway.sql.scope import DIALECT, fold, table_parts, table_refs, walk_tables
from query_gateway.sql.validate import resolve_reference
from query_gateway.sql.verify import RF_ALIAS, is_true, verify_narrowed


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


CACHE_SIZE = 1024
_CacheKey = tuple[str, int, bool, NarrowShape]
_cache: BoundedCache[_CacheKey, tuple[Catalogue, _Rewritten]] = BoundedCache(CACHE_SIZE)
_cache_lock = threading.Lock()


def narrow_query(
    q: ValidatedQuery,
    catalogue: Catalogue,
    plans: Mapping[str, Sequence[Plan]],
    columns: ColumnTypes,
    mask_key: MaskKey | None = None,
) -> NarrowedQuery:
    """Every real table reference becomes `(SELECT <exposed> FROM schema.table AS _dp_rf WHERE
    <pred> OFFSET 0) alias`, a barrier (see `_narrowed`) listing exactly the dataset's exposed
    columns (`*` without a `columns:` list). A deny — a `deny` plan, or an allow-list none of
    whose values converts — puts FALSE into every SELECT. Raises ServiceError("sql_refused") when
    anything cannot be proven, ServiceError("column_not_exposed") for a column it cannot reach."""
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
    rewritten = _narrowed_sql(q, catalogue, columns, denied, tuple(shape))
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
    )


def _narrowed_sql(
    q: ValidatedQuery, catalogue: Catalogue, columns: ColumnTypes, denied: bool, shape: NarrowShape
) -> _Rewritten:
    key = (q.text, id(catalogue), denied, shape)
    with _cache_lock:
        hit = _cache.get(key)
        # the entry holds the catalogue itself, so its id cannot be reused while the entry lives
        if hit is not None and hit[0] is catalogue:
            return hit[1]
    narrowed = _rewrite(q, catalogue, columns, denied, shape)
    with _cache_lock:
        _cache.put(key, (catalogue, narrowed))
    return narrowed


def _rewrite(
    q: ValidatedQuery, catalogue: Catalogue, columns: ColumnTypes, denied: bool, shape: NarrowShape
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

    tree = q.tree.copy()
    if denied:
        for select in list(tree.find_all(exp.Select)):
            select.where(exp.false(), append=True, copy=False)
    for table, is_cte in list(walk_tables(tree)):
        if is_cte:
            continue
        folded, raw = table_refs(table)
        found = resolve_reference(folded, raw, catalogue)
        if found is None or found not in preds:
            raise ServiceError("sql_refused", "a table reference could not be narrowed")
        table.replace(_narrowed(table, entries[found], preds[found], fences[found]))
    sql = tree.sql(dialect=DIALECT)

    expected: dict[tuple[str, ...], set[tuple[str, str]]] = {}
    built: list[tuple[str, str]] = []
    for ds_id, pred in preds.items():
        entry = entries[ds_id]
        key = physical_key(physical_table(entry))
        expected.setdefault(key, set()).add((pred.sql(dialect=DIALECT), rendered(fences[ds_id])))
        fence = _narrowed(physical_table(entry), entry, pred, fences[ds_id]).this
        built.append((entry.table, fence.sql(dialect=DIALECT)))
    verify_narrowed(sql, expected, denied=denied, n_params=n_params + (2 if masked else 0))
    # the rewrite replaces table references only, so the top-level ORDER BY is the caller's own
    return _Rewritten(
        sql, outer_order_by(q.tree), masked, tuple(exposure[ds_id] for ds_id, _ in shape), tuple(built)
    )


def _narrowed(
    table: exp.Table, entry: DatasetEntry, pred: exp.Expr, projection: list[exp.Expr] | None
) -> exp.Subquery:
    """The narrowing subquery of one table reference.

    A plain subquery is pulled up by PostgreSQL into the query around it, and the quals of one
    scan are then ordered by estimated cost: a cheap predicate of the caller's can run on a row
    *before* the filter rejects it, and a predicate that raises on one value turns the error into
    an answer about a row the caller may not read. `OFFSET 0` keeps the subquery a planning unit
    of its own — never pulled up, no qual pushed into it — so every row the caller's SQL sees has
    passed the filter (the guarantee of PostgreSQL's security_barrier views). A predicate
    of TRUE hides no row, so there is nothing to fence and the caller's predicates keep the
    table's indexes.

    The select list is the dataset's exposure (`projection`; None: `*`): a column it leaves out
    exists for no expression above the subquery, whatever the caller writes."""
    source = physical_table(entry)
    source.set("alias", exp.TableAlias(this=exp.to_identifier(RF_ALIAS)))
    listed = [p.copy() for p in projection] if projection is not None else [exp.Star()]
    inner = exp.Select(expressions=listed).from_(source, copy=False).where(pred.copy(), copy=False)
    if not is_true(pred):
        inner.set("offset", exp.Offset(expression=exp.Literal.number(0)))
    alias = table.args.get("alias")
    if not isinstance(alias, exp.TableAlias):
        # unaliased, the statement refers to the table by its last name part: keep that name
        alias = exp.TableAlias(this=table_parts(table)[-1].copy())
    return exp.Subquery(this=inner, alias=alias.copy())
