"""Governed SQL: validation (docs/gateway.md, "SQL rules"), narrowing (docs/row-filters.md),
verification and read-only execution (QE-04, docs/gateway.md, "Limits and execution"), a records
page's statement and a change session's (docs/records.md). Every statement the gateway sends is
built in this package; code outside it imports from here, never from its modules (the import
check, tests/test_import_boundaries.py)."""

from query_gateway.sql.changes import (
    CHANGE,
    CHANGE_INDEX,
    CHANGE_TYPE,
    DELETED_TYPES,
    HORIZON,
    VISIBLE,
    ChangeOrder,
    ChangesRead,
    Position,
    RangeCondition,
    changes_statement,
    watch_statement,
)
from query_gateway.sql.changes import KEY_PREFIX as CHANGE_KEY_PREFIX
from query_gateway.sql.columns import load_column_types
from query_gateway.sql.execute import QueryExecutor, check_text, datasets_pool, rolled_back_only
from query_gateway.sql.exposure import MaskKey, dataset_columns, hash_masks
from query_gateway.sql.growth import GrowthRefused, check_growth
from query_gateway.sql.leakproof import LeakproofOperators, load_leakproof_operators
from query_gateway.sql.model import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    CatalogueMismatch,
    ColumnTypes,
    NarrowedQuery,
    QueryPage,
    ValidatedQuery,
)
from query_gateway.sql.pg_verify import (
    check_changes_statement,
    check_narrowed,
    check_original,
    check_records_page,
)
from query_gateway.sql.records_page import KEY_PREFIX, Condition, RecordsPage, key_output, records_statement
from query_gateway.sql.rewrite import narrow_query
from query_gateway.sql.scope import quoted
from query_gateway.sql.shape import shape_of, sql_shape
from query_gateway.sql.validate import validate_query

__all__ = [
    "CHANGE",
    "CHANGE_INDEX",
    "CHANGE_KEY_PREFIX",
    "CHANGE_TYPE",
    "DEFAULT_LIMIT",
    "DELETED_TYPES",
    "HORIZON",
    "KEY_PREFIX",
    "MAX_LIMIT",
    "VISIBLE",
    "CatalogueMismatch",
    "ChangeOrder",
    "ChangesRead",
    "ColumnTypes",
    "Condition",
    "GrowthRefused",
    "LeakproofOperators",
    "MaskKey",
    "NarrowedQuery",
    "Position",
    "QueryExecutor",
    "QueryPage",
    "RangeCondition",
    "RecordsPage",
    "ValidatedQuery",
    "changes_statement",
    "check_changes_statement",
    "check_growth",
    "check_narrowed",
    "check_original",
    "check_records_page",
    "check_text",
    "dataset_columns",
    "datasets_pool",
    "hash_masks",
    "key_output",
    "load_column_types",
    "load_leakproof_operators",
    "narrow_query",
    "quoted",
    "records_statement",
    "rolled_back_only",
    "shape_of",
    "sql_shape",
    "validate_query",
    "watch_statement",
]
