"""QE-04: a page's items are each row's values as JSON carries them. `page_items` chooses the
conversion once per column from the first row (issue 20, hot path); these tests hold it to
`jsonable` on every value, for every kind of column the driver returns, NULL first or later."""

from __future__ import annotations

import asyncpg

from dataplane_testing.sqlgw import Db
from query_gateway.sql.rows import jsonable, page_items

# one row per kind of value, NULL in the first row of half the columns, then values
_ROWS = """
SELECT * FROM (VALUES
  (1, NULL::int, 'a', NULL::text, timestamptz '2026-01-01 10:00:00.5+00', NULL::timestamptz,
   date '2026-01-02', time '10:00', NULL::timetz, 1.50::numeric, NULL::numeric, 7::numeric,
   gen_random_uuid(), NULL::uuid, '{"a": [1, 2.5]}'::jsonb, ARRAY[1.5, 2]::numeric[], '\\x0102'::bytea,
   true, NULL::float8, interval '90 seconds', timestamp '0999-01-01 00:00:00.000001',
   timetz '01:02:03.5-05', 42),
  (2, 5, 'b', 'x', timestamptz '2026-01-01 10:00:00+00', timestamptz '2026-01-03 00:00:00+00',
   NULL::date, NULL::time, timetz '10:00+02', NULL::numeric, 2.25::numeric, 8::numeric,
   NULL::uuid, gen_random_uuid(), NULL::jsonb, NULL::numeric[], NULL::bytea,
   NULL::bool, 1.5::float8, NULL::interval, timestamp '2026-06-30 23:59:59', NULL::timetz, 43)
) AS t(i, i_null_first, s, s_null_first, ts, ts_null_first, d, tm, tz_null_first, n, n_null_first,
       n_int, u, u_null_first, j, arr, b, flag, f_null_first, iv, naive, tz, last)
"""


async def _rows(db: Db) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(db.url)
    try:
        return list(await conn.fetch(_ROWS))
    finally:
        await conn.close()


async def test_qe04_page_items_equal_jsonable_on_every_value(db: Db) -> None:
    rows = await _rows(db)
    expected = [{k: jsonable(v) for k, v in r.items()} for r in rows]
    assert page_items(rows) == expected
    assert expected[0]["ts"] == "2026-01-01T10:00:00.500000+00:00"  # the conversion happened
    assert expected[1]["n_null_first"] == 2.25 and expected[0]["n_int"] == 7
    assert expected[0]["naive"] == "0999-01-01T00:00:00.000001"
    assert expected[1]["tz_null_first"] == "10:00:00+02:00"
    assert expected[0]["tz"] == "01:02:03.500000-05:00"  # a zoned time: isoformat, value by value


async def test_qe04_page_items_drop_the_total_column_only(db: Db) -> None:
    rows = await _rows(db)
    items = page_items(rows, drop_last=True)
    assert [list(i) for i in items] == [list(rows[0].keys())[:-1]] * 2
    assert items == [{k: jsonable(v) for k, v in list(r.items())[:-1]} for r in rows]


def test_qe04_page_items_of_no_rows() -> None:
    assert page_items([]) == [] and page_items([], drop_last=True) == []
