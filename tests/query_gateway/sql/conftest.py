"""SQL-layer fixtures: a datasets database seeded with the tables of dataplane_testing.sqlgw, and a pool."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest

from dataplane_testing.sqlgw import CATALOGUE, SCHEMA_A, Db, seed
from query_gateway.sql import QueryExecutor, load_column_types
from query_gateway.sql.execute import datasets_pool


@pytest.fixture
async def db(fresh_database: str) -> AsyncIterator[Db]:
    conn = await asyncpg.connect(fresh_database)
    try:
        await conn.execute(SCHEMA_A)
        await seed(conn, "public.readings", "public.meters", 'energy."Sites"')
    finally:
        await conn.close()
    # the gateway's own pool: read-only sessions with the timeout, one statement per page
    pool = await datasets_pool(fresh_database, statement_timeout_ms=5000, max_size=2)
    try:
        columns = await load_column_types(pool, CATALOGUE)
        yield Db(fresh_database, pool, columns, QueryExecutor(pool, 5000, session_defaults=True))
    finally:
        await pool.close()
