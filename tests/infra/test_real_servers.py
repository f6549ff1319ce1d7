"""The fixtures reach real servers over sockets."""

from __future__ import annotations

import asyncpg
import redis.asyncio as aioredis


async def test_postgres_fixture_is_a_real_server(fresh_database: str) -> None:
    conn = await asyncpg.connect(fresh_database)
    try:
        version = await conn.fetchval("SELECT version()")
    finally:
        await conn.close()
    assert version.startswith("PostgreSQL")


async def test_redis_fixture_is_a_real_server(redis_url: str) -> None:
    client = aioredis.from_url(redis_url)
    try:
        info = await client.info("server")
    finally:
        await client.aclose()
    assert "redis_version" in info
