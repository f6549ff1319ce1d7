# ruff: noqa: E501 - SQL test data reads best on one line
"""A typed filter column (integer, uuid) on a table of 50 000 rows: the allow-list is bound as an
array of the column's type, so its index is used; values that do not convert are dropped."""

from __future__ import annotations

import uuid

import asyncpg
import pytest

from dataplane_contracts.catalogue import Catalogue
from dataplane_contracts.plans import Plan
from query_gateway.sql import QueryExecutor, load_column_types, narrow_query, validate_query

N = 50_000
CATALOGUE = Catalogue.model_validate(
    {
        "datasets": [
            {
                "id": "big.meters",
                "table": "public.big",
                "row_filters": {
                    "person": {"handler": "direct_user_match", "args": {"column": "meter_id"}},
                    "organization": {"handler": "member_wide"},
                },
            }
        ]
    }
)


def _uuid(i: int) -> uuid.UUID:
    return uuid.UUID(int=i + 1)


@pytest.fixture
async def big(fresh_database: str) -> asyncpg.Pool:
    conn = await asyncpg.connect(fresh_database)
    await conn.execute(
        "CREATE TABLE public.big (id bigserial PRIMARY KEY, meter_id integer NOT NULL, device uuid NOT NULL,"
        " value integer NOT NULL);"
        "INSERT INTO public.big (meter_id, device, value) SELECT g, "
        "('00000000-0000-0000-0000-' || lpad(to_hex(g + 1), 12, '0'))::uuid, g % 97 FROM generate_series(0, $1) g;"
        "CREATE INDEX big_meter_idx ON public.big (meter_id);"
        "CREATE INDEX big_device_idx ON public.big (device);"
        "ANALYZE public.big;".replace("$1", str(N - 1))
    )
    await conn.close()
    return await asyncpg.create_pool(fresh_database, min_size=1, max_size=2)


@pytest.mark.parametrize(
    ("column", "values", "index", "expected"),
    [
        ("meter_id", [7, "42", "x42", "4.5", True, 2**40], "big_meter_idx", [7, 42]),
        ("device", [str(_uuid(7)), str(_uuid(42)).upper(), "not-a-uuid", 42], "big_device_idx", [7, 42]),
    ],
)
async def test_typed_column_uses_its_index_and_drops_unconvertible(
    big: asyncpg.Pool, column: str, values: list[object], index: str, expected: list[int]
) -> None:
    try:
        columns = await load_column_types(big, CATALOGUE)
        plans = {"big.meters": [Plan.among(column, values)]}
        sql = "SELECT meter_id, value FROM big.meters"
        narrowed = narrow_query(validate_query(sql, CATALOGUE), CATALOGUE, plans, columns)
        assert len(narrowed.params) == 1 and len(narrowed.params[0]) == 2  # type: ignore[arg-type]
        async with big.acquire() as conn:
            plan = "\n".join(r[0] for r in await conn.fetch("EXPLAIN " + narrowed.sql, *narrowed.params))
        assert index in plan and ("Index Scan" in plan or "Bitmap" in plan), plan
        assert "Seq Scan" not in plan, plan
        page = await QueryExecutor(big, 5000).run(narrowed, offset=0, limit=100, skip_count=False)
        assert sorted(i["meter_id"] for i in page.items) == expected
        assert page.total == 2
    finally:
        await big.close()
