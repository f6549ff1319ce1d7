# ruff: noqa: E501 - SQL test data reads best on one line
"""A typed filter column (integer, uuid) on a table of 50 000 rows after ANALYZE: the allow-list is
bound as an array of the column's type, so its index is used; values that do not convert are
dropped. The issue's clause is proven from typed data keys through the gateway's own
`subject_key_match` (RF-03/RF-04), and from raw plan values for the converter's edge cases."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from dataplane_contracts.catalogue import Catalogue
from dataplane_contracts.plans import Plan
from query_gateway.rules.layers import LayerRequest, apply_pure
from query_gateway.sql import NarrowedQuery, QueryExecutor, load_column_types, narrow_query, validate_query

N = 50_000
SQL = "SELECT meter_id, value FROM big.meters"


def _catalogue(column: str, key_type: str | None) -> Catalogue:
    """The person layer by keys of one type, or (key_type None) by the user ids of the plan."""
    person: dict[str, object] = (
        {"handler": "direct_user_match", "args": {"column": column}}
        if key_type is None
        else {"handler": "subject_key_match", "args": {"column": column, "key_type": key_type}}
    )
    return Catalogue.model_validate(
        {
            "datasets": [
                {
                    "id": "big.meters",
                    "table": "public.big",
                    "row_filters": {"person": person, "organization": {"handler": "member_wide"}},
                }
            ]
        }
    )


def _uuid(i: int) -> uuid.UUID:
    """The device of the row whose meter_id is i (as the fixture's INSERT derives it)."""
    return uuid.UUID(int=i + 1)


@pytest.fixture
async def big(fresh_database: str) -> AsyncIterator[asyncpg.Pool]:
    conn = await asyncpg.connect(fresh_database)
    try:
        await conn.execute(
            "CREATE TABLE public.big (id bigserial PRIMARY KEY, meter_id integer NOT NULL, device uuid NOT NULL,"
            " value integer NOT NULL);"
            "INSERT INTO public.big (meter_id, device, value) SELECT g, "
            "('00000000-0000-0000-0000-' || lpad(to_hex(g + 1), 12, '0'))::uuid, g % 97 FROM generate_series(0, $1) g;"
            "CREATE INDEX big_meter_idx ON public.big (meter_id);"
            "CREATE INDEX big_device_idx ON public.big (device);"
            "ANALYZE public.big;".replace("$1", str(N - 1))
        )
        assert await conn.fetchval("SELECT count(*) FROM public.big") == N
    finally:
        await conn.close()
    pool = await asyncpg.create_pool(fresh_database, min_size=1, max_size=2)
    try:
        yield pool
    finally:
        await pool.close()


async def _assert_index_scan_and_rows(
    pool: asyncpg.Pool, narrowed: NarrowedQuery, index: str, expected: list[int]
) -> None:
    async with pool.acquire() as conn:
        plan = "\n".join(r[0] for r in await conn.fetch("EXPLAIN " + narrowed.sql, *narrowed.params))
    assert index in plan and ("Index Scan" in plan or "Bitmap" in plan), plan
    assert "Seq Scan" not in plan, plan
    page = await QueryExecutor(pool, 5000).run(narrowed, offset=0, limit=100, skip_count=False)
    assert sorted(i["meter_id"] for i in page.items) == expected
    assert page.total == len(expected)


KEYS = {
    "integer": (
        "meter_id",
        "meter",
        [
            "meter:42",
            "meter:7",
            "meter:42",  # a duplicate binds once
            "meter:x42",  # not an integer: dropped
            "meter:4.5",
            "meter:1099511627776",  # beyond integer: dropped, never an overflow error
            "device:99",  # another key type: never a value of this filter
            "meter99",  # malformed key (RF-03): skipped
        ],
        "big_meter_idx",
    ),
    "uuid": (
        "device",
        "device",
        [
            f"device:{_uuid(7)}",
            f"device:{str(_uuid(42)).upper()}",  # another spelling of a uuid converts
            "device:not-a-uuid",  # dropped
            "device:42",
            f"meter:{_uuid(99)}",  # another key type
        ],
        "big_device_idx",
    ),
}


@pytest.mark.parametrize("pg_type", KEYS)
async def test_typed_column_filtered_by_keys_uses_its_index_and_drops_unconvertible_keys(
    big: asyncpg.Pool, pg_type: str
) -> None:
    column, key_type, keys, index = KEYS[pg_type]
    catalogue = _catalogue(column, key_type)
    columns = await load_column_types(big, catalogue)
    assert columns["public.big"][column] == pg_type
    person = catalogue.datasets[0].row_filters.person
    assert person is not None
    # the plan exactly as the gateway applies a dataspace request's person layer (delegated)
    plan = apply_pure(
        LayerRequest(
            dataset_id="big.meters",
            handler=person.handler,
            args=person.args,
            caller=None,
            principals=(),
            keys=tuple(keys),
        )
    )
    narrowed = narrow_query(validate_query(SQL, catalogue), catalogue, {"big.meters": [plan]}, columns)
    assert not narrowed.denied
    # only the two convertible values of this key type are bound, as the column's own type
    assert len(narrowed.params) == 1
    bound = narrowed.params[0]
    assert isinstance(bound, list) and sorted(map(str, bound)) == sorted(
        [str(v) for v in ((7, 42) if pg_type == "integer" else (_uuid(7), _uuid(42)))]
    )
    await _assert_index_scan_and_rows(big, narrowed, index, [7, 42])


@pytest.mark.parametrize(
    ("column", "values", "index"),
    [
        ("meter_id", [7, "42", "x42", "4.5", True, 2**40], "big_meter_idx"),
        ("device", [str(_uuid(7)), str(_uuid(42)).upper(), "not-a-uuid", 42], "big_device_idx"),
    ],
)
async def test_typed_column_uses_its_index_and_drops_unconvertible_plan_values(
    big: asyncpg.Pool, column: str, values: list[object], index: str
) -> None:
    # a plan from the resolver may carry non-string values: a bool or an out-of-range int
    catalogue = _catalogue(column, None)
    columns = await load_column_types(big, catalogue)
    plans = {"big.meters": [Plan.among(column, values)]}
    narrowed = narrow_query(validate_query(SQL, catalogue), catalogue, plans, columns)
    assert len(narrowed.params) == 1 and len(narrowed.params[0]) == 2  # type: ignore[arg-type]
    await _assert_index_scan_and_rows(big, narrowed, index, [7, 42])


async def test_typed_column_keys_none_of_which_convert_are_a_deny(big: asyncpg.Pool) -> None:
    catalogue = _catalogue("device", "device")
    columns = await load_column_types(big, catalogue)
    plan = apply_pure(
        LayerRequest(
            dataset_id="big.meters",
            handler="subject_key_match",
            args={"column": "device", "key_type": "device"},
            caller=None,
            principals=(),
            keys=("device:not-a-uuid", "device:42", f"meter:{_uuid(7)}"),
        )
    )
    narrowed = narrow_query(validate_query(SQL, catalogue), catalogue, {"big.meters": [plan]}, columns)
    assert narrowed.denied and narrowed.params == ()  # RF-05: nothing left to allow
    page = await QueryExecutor(big, 5000).run(narrowed, offset=0, limit=100, skip_count=False)
    assert (page.items, page.total) == ([], 0)
