"""Databases of their own on the session's PostgreSQL server (`postgres_url`): made for a test,
a module or a session, and dropped (WITH FORCE) afterwards."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator

import asyncpg


async def admin(server_url: str, *statements: str) -> None:
    """Statements run in turn on one connection (CREATE DATABASE and the like)."""
    conn = await asyncpg.connect(server_url)
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


def database_url(server_url: str, name: str) -> str:
    """The URL of database `name` on the server of `server_url`."""
    return f"{server_url.rpartition('/')[0]}/{name}"


async def create_database(server_url: str, prefix: str = "t_", template: str | None = None) -> str:
    """A new database named `prefix` and a random suffix, empty or a copy of `template`; its URL."""
    name = f"{prefix}{uuid.uuid4().hex[:12]}"
    copy = f' TEMPLATE "{template}"' if template else ""
    await admin(server_url, f'CREATE DATABASE "{name}"{copy}')
    return database_url(server_url, name)


async def drop_database(server_url: str, url: str) -> None:
    """The database of `url` dropped, whoever is still connected to it."""
    name = url.rpartition("/")[2]
    await admin(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.asynccontextmanager
async def scratch_database(server_url: str, schema: str, prefix: str = "scratch_") -> AsyncIterator[str]:
    """A database of its own, created with `schema`, dropped after; its URL."""
    url = await create_database(server_url, prefix)
    try:
        await admin(url, schema)
        yield url
    finally:
        await drop_database(server_url, url)


@contextlib.asynccontextmanager
async def scratch_connection(
    server_url: str, schema: str, prefix: str = "scratch_"
) -> AsyncIterator[asyncpg.Connection]:
    """A connection to a database of its own, created with `schema`, dropped after."""
    async with scratch_database(server_url, schema, prefix) as url:
        conn = await asyncpg.connect(url)
        try:
            yield conn
        finally:
            await conn.close()
