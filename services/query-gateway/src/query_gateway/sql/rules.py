"""The SQL rules (docs/gateway.md, "SQL rules"): allowed constructs and the function allowlist."""

from __future__ import annotations

from sqlglot import exp

MAX_DEPTH = 200

# whole names, case-insensitive; IFNULL parses to COALESCE
FUNCTION_ALLOWLIST = frozenset(
    {
        "st_intersects",
        "st_within",
        "st_contains",
        "st_transform",
        "st_distance",
        "st_setsrid",
        "st_geomfromgeojson",
        "st_point",
        "st_xmin",
        "st_ymin",
        "st_xmax",
        "st_ymax",
        "st_extent",
        "st_asgeojson",
        "st_simplify",
        "lower",
        "upper",
        "length",
        "trim",
        "ltrim",
        "rtrim",
        "substring",
        "replace",
        "abs",
        "round",
        "ceil",
        "floor",
        "coalesce",
        "nullif",
        "greatest",
        "least",
        "bool_or",
        "bool_and",
        "percentile_cont",
        "percentile_disc",
        "row_number",
        "rank",
        "dense_rank",
        "current_date",
        "current_timestamp",
        "date",
        "date_trunc",
        "extract",
        "now",
    }
)

# QE-08: functions that generate rows (or text) without a bound a statement can see; refused by
# name even if someone allowlisted one of them (sqlglot's own names among them)
UNBOUNDED_GENERATORS = frozenset(
    {
        "generate_series",
        "exploding_generate_series",
        "generate_subscripts",
        "unnest",
        "explode",
        "posexplode",
        "repeat",
        "lpad",
        "rpad",
        "pad",
        "regexp_split_to_table",
        "string_to_table",
        "json_array_elements",
        "jsonb_array_elements",
    }
)
assert not UNBOUNDED_GENERATORS & FUNCTION_ALLOWLIST, "QE-08: an unbounded generator is never allowlisted"

# sqlglot names some allowlisted functions after another dialect's spelling
_CLASS_ALIASES: tuple[type[exp.Expr], ...] = (
    exp.TimestampTrunc,  # date_trunc
    exp.DateTrunc,
    exp.LogicalOr,  # bool_or
    exp.LogicalAnd,  # bool_and
)

# structural nodes and the operators/aggregates allowed by node type (docs/gateway.md, "SQL rules")
ALLOWED_NODES: tuple[type[exp.Expr], ...] = (
    exp.Select,
    exp.From,
    exp.With,
    exp.CTE,
    exp.Table,
    exp.TableAlias,
    exp.Alias,
    exp.Star,
    exp.Column,
    exp.Identifier,
    exp.Dot,
    exp.Distinct,
    exp.Join,
    exp.Where,
    exp.And,
    exp.Or,
    exp.Not,
    exp.Paren,
    exp.EQ,
    exp.NEQ,
    exp.GT,
    exp.GTE,
    exp.LT,
    exp.LTE,
    exp.In,
    exp.Tuple,
    exp.Between,
    exp.Is,
    exp.Literal,
    exp.Boolean,
    exp.Null,
    exp.Order,
    exp.Ordered,
    exp.Limit,
    exp.Offset,
    exp.Group,
    exp.Having,
    exp.Max,
    exp.Min,
    exp.Avg,
    exp.Sum,
    exp.Count,
    exp.ArrayAgg,
    exp.Filter,
    exp.WithinGroup,
    exp.Window,
    exp.WindowSpec,
    exp.Case,
    exp.If,
    exp.Values,
    exp.Subquery,
    exp.Add,
    exp.Sub,
    exp.Mul,
    exp.Div,
    exp.Interval,
    exp.CurrentDate,
    exp.CurrentTimestamp,
    exp.DateAdd,
    exp.DateSub,
    exp.TsOrDsToTimestamp,
    exp.Cast,
    exp.DataType,
    exp.DataTypeParam,
    exp.Var,
    exp.Lateral,
)

REFUSED_CONSTRUCTS: tuple[type[exp.Expr], ...] = (
    exp.Union,
    exp.Intersect,
    exp.Except,
)

SYSTEM_SCHEMAS = frozenset({"pg_catalog", "information_schema", "pg_toast"})
RESERVED_PREFIX = "_dp_"

# a table reference may carry only these; ONLY, TABLESAMPLE, hints, time travel… are refused
TABLE_ARGS = frozenset({"this", "db", "catalog", "alias"})


def function_allowed(node: exp.Func) -> bool:
    if unbounded_generator(node):
        return False
    if isinstance(node, exp.Anonymous):
        return str(node.this).lower() in FUNCTION_ALLOWLIST
    if isinstance(node, _CLASS_ALIASES):
        return True
    return any(name.lower() in FUNCTION_ALLOWLIST for name in node.sql_names())


# sqlglot's names of PostgreSQL's generators, spelled back as the statement wrote them
_PG_SPELLING = {"EXPLODING_GENERATE_SERIES": "GENERATE_SERIES", "EXPLODE": "UNNEST", "PAD": "LPAD/RPAD"}


def postgres_name(name: str) -> str:
    return _PG_SPELLING.get(name.upper(), name.upper())


def unbounded_generator(node: exp.Func) -> bool:
    names = [str(node.this)] if isinstance(node, exp.Anonymous) else node.sql_names()
    return any(name.lower() in UNBOUNDED_GENERATORS for name in names)


def depth_of(root: exp.Expr) -> int:
    deepest = 0
    stack: list[tuple[exp.Expr, int]] = [(root, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > MAX_DEPTH:
            break
        stack.extend((child, depth + 1) for child in node.iter_expressions())
    return deepest
