"""Governed SQL: validation (docs/gateway.md, "SQL rules"), narrowing (docs/row-filters.md), verification
and read-only execution (QE-04, docs/gateway.md, "Limits and execution")."""

from query_gateway.sql.columns import load_column_types
from query_gateway.sql.execute import QueryExecutor
from query_gateway.sql.model import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    CatalogueMismatch,
    ColumnTypes,
    NarrowedQuery,
    QueryPage,
    ValidatedQuery,
)
from query_gateway.sql.rewrite import narrow_query
from query_gateway.sql.shape import sql_shape
from query_gateway.sql.validate import validate_query

__all__ = [
    "DEFAULT_LIMIT",
    "MAX_LIMIT",
    "CatalogueMismatch",
    "ColumnTypes",
    "NarrowedQuery",
    "QueryExecutor",
    "QueryPage",
    "ValidatedQuery",
    "load_column_types",
    "narrow_query",
    "sql_shape",
    "validate_query",
]
