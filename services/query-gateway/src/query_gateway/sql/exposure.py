"""Column exposure (issue 15): which columns of a dataset a statement can reach, and how a masked
one reads.

The narrowing subquery of a dataset with a `columns:` list selects exactly its exposed columns —
a `null` mask as `NULL` of the column's type, a `hash` mask as a keyed pseudonym — instead of `*`.
Nothing above the fence can name a column it does not list: not a clause, a `*` or `t.*`, a
subquery, a CTE body, nor a whole-row reference (`t`, `array_agg(t)`), which is a row of the
fence. The row filter is the fence's own WHERE, on the physical table, so its column need not be
exposed. References to names a statement cannot reach are refused up front in references.py
(`column_not_exposed`), from the exposed names alone, so the answer is the same whether the
column exists or not.

The `hash` pseudonym is HMAC-SHA-256 (RFC 2104) of the value's text form (UTF-8), keyed by
COLUMN_MASK_KEY, computed by PostgreSQL's built-in `sha256()` so no extension is needed in the
datasets database: H((K ^ opad) || H((K ^ ipad) || m)), the two padded keys bound as parameters.
A keyed MAC, unlike `md5(key || value)`, is a pseudorandom function of the value: without the key
nobody can compute a pseudonym, nor test a guessed value against one; with the same key the same
value always reads the same (joinable, countable). A NULL stays NULL."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import sqlglot
from sqlglot import exp

from dataplane_contracts.catalogue import Catalogue, DatasetEntry
from query_gateway.sql.model import CatalogueMismatch, ColumnTypes, DatasetColumns
from query_gateway.sql.scope import DIALECT
from query_gateway.sql.verify import RF_ALIAS, select_list

_BLOCK = 64  # SHA-256's block size in bytes (RFC 2104's B)
MASK_KEY_LABELS = ("column mask key (HMAC inner pad)", "column mask key (HMAC outer pad)")


@dataclass(frozen=True)
class MaskKey:
    """The deployment's pseudonym key as the two padded keys HMAC needs. Never logged."""

    inner: bytes
    outer: bytes

    @classmethod
    def of(cls, secret: str) -> MaskKey:
        key = secret.encode("utf-8")
        if len(key) > _BLOCK:
            key = hashlib.sha256(key).digest()
        key = key.ljust(_BLOCK, b"\x00")
        return cls(bytes(b ^ 0x36 for b in key), bytes(b ^ 0x5C for b in key))

    @property
    def params(self) -> tuple[bytes, bytes]:
        return self.inner, self.outer

    def __repr__(self) -> str:
        return "MaskKey(<withheld>)"

    __str__ = __repr__


def dataset_columns(entry: DatasetEntry, columns: ColumnTypes) -> DatasetColumns:
    table = tuple(columns.get(entry.table, {}))
    if entry.columns is None:
        return DatasetColumns(entry.id, False, tuple((name, None) for name in table))
    declared = {c.name for c in entry.columns}
    masks = entry.masks
    # table order, so `SELECT *` reads as the table with the hidden columns left out
    return DatasetColumns(entry.id, True, tuple((n, masks.get(n)) for n in table if n in declared))


def check_exposure(entry: DatasetEntry, table_columns: ColumnTypes) -> None:
    """GS-09 for exposure: a `columns:` list naming a column the table lacks refuses start-up."""
    present = table_columns.get(entry.table, {})
    for spec in entry.columns or ():
        if spec.name not in present:
            raise CatalogueMismatch(
                f"dataset {entry.id}: columns lists {spec.name}, which table {entry.table} lacks"
            )


def hash_masks(catalogue: Catalogue) -> list[str]:
    """The datasets declaring a `hash` mask: they need COLUMN_MASK_KEY."""
    return [e.id for e in catalogue.datasets if "hash" in e.masks.values()]


def fence_column(name: str) -> exp.Column:
    """`_dp_rf."name"`: a column of the physical table inside the narrowing subquery."""
    return exp.column(exp.to_identifier(name, quoted=True), table=exp.to_identifier(RF_ALIAS))


def _null_of(pg_type: str | None) -> exp.Expr:
    """NULL of the column's own type, so expressions over it keep working; text when the type
    name does not parse (it is NULL either way)."""
    try:
        to = exp.DataType.build(pg_type or "text", dialect=DIALECT, udt=True)
    except Exception:
        to = exp.DataType.build("text")
    return exp.Cast(this=exp.Null(), to=to)


def _hmac(name: str, first_param: int) -> exp.Expr:
    inner, outer = (
        exp.cast(exp.Parameter(this=exp.Literal.number(first_param + i)), "bytea", dialect=DIALECT)
        for i in (0, 1)
    )
    text = exp.cast(fence_column(name), "text", dialect=DIALECT)
    message = exp.Anonymous(this="convert_to", expressions=[text, exp.Literal.string("UTF8")])
    digest = exp.Anonymous(this="sha256", expressions=[exp.DPipe(this=inner, expression=message)])
    outer_digest = exp.Anonymous(this="sha256", expressions=[exp.DPipe(this=outer, expression=digest)])
    return exp.Anonymous(this="encode", expressions=[outer_digest, exp.Literal.string("hex")])


def fence_projection(
    exposed: DatasetColumns, types: ColumnTypes, table: str, *, denied: bool, key_param: int
) -> list[exp.Expr] | None:
    """The narrowing subquery's select list; None: `*` (no `columns:` list). A denied statement
    reads no row and binds nothing, so its hash masks are NULL text."""
    if not exposed.declared:
        return None
    out: list[exp.Expr] = []
    for name, mask in exposed.columns:
        if mask is None:
            out.append(fence_column(name))
            continue
        if mask == "null":
            value = _null_of(types.get(table, {}).get(name))
        elif denied:
            value = exp.Cast(this=exp.Null(), to=exp.DataType.build("text"))
        else:
            value = _hmac(name, key_param)
        out.append(exp.alias_(value, exp.to_identifier(name, quoted=True)))
    return out


def rendered(projection: list[exp.Expr] | None) -> str:
    """A select list as the verifier compares it: as a fresh parse of it renders ('*' for None)."""
    if projection is None:
        return "*"
    text = ", ".join(p.sql(dialect=DIALECT) for p in projection)
    reparsed = sqlglot.parse_one(f"SELECT {text}", read=DIALECT)
    return select_list(reparsed)
