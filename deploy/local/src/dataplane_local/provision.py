"""What the local stack puts into its servers: topics, databases, roles and the demo dataset.

Everything here is idempotent, so it also runs against existing servers named by
`DATAPLANE_DATABASE_URL` / `DATAPLANE_KAFKA_BOOTSTRAP`, and on the second `up` over a kept
PostgreSQL data directory."""

from __future__ import annotations

import os
from urllib.parse import quote, urlsplit, urlunsplit

import asyncpg

DATASETS_DB = "datasets"
FLOWS_DB = "flows"
PULL_READER = "dataplane_pull_reader"  # DPS_PULL_GRANT_ROLE: signaling's migrations grant its view
DATASETS_READER = "dataplane_datasets_reader"  # the gateway's and resolver's read-only role
ROLE_PASSWORD = "dataplane-local"  # development only; the embedded server trusts loopback anyway

READER_TEMP_FILE_LIMIT = "256MB"  # the gateway's READER_TEMP_FILE_LIMIT (query_gateway.sql.execute)

DEMO_PODS = ["IT001E00000001", "IT001E00000002", "IT001E00000003", "IT001E00000004"]
DEMO_HOURS = 24


async def create_topics(bootstrap: str) -> list[str]:
    """Every topic of `dataplane_contracts.topics` with its partitions (`dataplane-topics create`,
    the service kit's command)."""
    from dataplane_contracts.topics import topic_specs
    from dataplane_service_kit.topics_cli import create_topics as kit_create_topics

    # the local broker (or an existing dev broker) is a single node; the topics command reads
    # this variable (aiokafka refuses a replication factor of -1 without replica assignments)
    os.environ.setdefault("KAFKA_REPLICATION_FACTOR", "1")
    return await kit_create_topics(bootstrap, topic_specs())


async def topic_partitions(bootstrap: str) -> dict[str, int]:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        described = await admin.describe_topics()
        return {t["topic"]: len(t["partitions"]) for t in described}
    finally:
        await admin.close()


def with_database(url: str, database: str, user: str | None = None, password: str | None = None) -> str:
    """The same server URL naming another database (and optionally another login)."""
    parts = urlsplit(url)
    netloc = parts.netloc.rpartition("@")[2]
    if user is not None:
        cred = quote(user, safe="") + (f":{quote(password, safe='')}" if password else "")
        netloc = f"{cred}@{netloc}"
    elif "@" in parts.netloc:
        netloc = parts.netloc
    return urlunsplit((parts.scheme, netloc, f"/{database}", parts.query, ""))


async def _ensure_role(conn: asyncpg.Connection, role: str) -> None:
    exists = await conn.fetchval("SELECT 1 FROM pg_roles WHERE rolname = $1", role)
    # role names are our constants, never input: identifiers cannot be bound parameters
    if not exists:
        await conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{ROLE_PASSWORD}'")
    else:
        # an existing server may hold the role already, made by its operator (or by a test that
        # granted the view to it) without the right to log in: the local stack's services need it
        await conn.execute(f"ALTER ROLE {role} LOGIN PASSWORD '{ROLE_PASSWORD}'")


async def _ensure_database(conn: asyncpg.Connection, name: str) -> None:
    if not await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name):
        await conn.execute(f'CREATE DATABASE "{name}"')


async def provision_postgres(admin_url: str) -> None:
    """Databases `datasets` and `flows`, the two read-only roles, and the seeded demo table."""
    conn = await asyncpg.connect(admin_url)
    try:
        for db in (DATASETS_DB, FLOWS_DB):
            await _ensure_database(conn, db)
        for role in (PULL_READER, DATASETS_READER):
            await _ensure_role(conn, role)
        await conn.execute(f"ALTER ROLE {DATASETS_READER} SET default_transaction_read_only = on")
        # docs/operations.md: a session cannot set its own temp_file_limit (superuser only), so the
        # role carries it; the gateway's sessions set work_mem and no parallel workers themselves
        await conn.execute(f"ALTER ROLE {DATASETS_READER} SET temp_file_limit = '{READER_TEMP_FILE_LIMIT}'")
        await conn.execute(f"ALTER ROLE {PULL_READER} SET default_transaction_read_only = on")
        await conn.execute(f'GRANT CONNECT ON DATABASE "{DATASETS_DB}" TO {DATASETS_READER}')
        await conn.execute(f'GRANT CONNECT ON DATABASE "{FLOWS_DB}" TO {PULL_READER}')
    finally:
        await conn.close()
    await seed_datasets(with_database(admin_url, DATASETS_DB))


async def seed_datasets(datasets_url: str) -> None:
    conn = await asyncpg.connect(datasets_url)
    try:
        async with conn.transaction():
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS public.meter_readings"
                " (pod text NOT NULL, ts timestamptz NOT NULL, value double precision NOT NULL)"
            )
            await conn.execute(
                "CREATE INDEX IF NOT EXISTS meter_readings_pod_idx ON public.meter_readings (pod)"
            )
            if not await conn.fetchval("SELECT EXISTS (SELECT 1 FROM public.meter_readings)"):
                # deterministic values, so the demo prints the same rows on every machine
                await conn.execute(
                    "INSERT INTO public.meter_readings (pod, ts, value)"
                    " SELECT p.pod, timestamptz '2026-01-01 00:00:00+00' + make_interval(hours => h),"
                    "        round((0.2 + p.n * 0.1 + (h % 6) * 0.05)::numeric, 3)::double precision"
                    " FROM unnest($1::text[]) WITH ORDINALITY AS p(pod, n), generate_series(0, $2 - 1) AS h",
                    DEMO_PODS,
                    DEMO_HOURS,
                )
            await conn.execute(f"GRANT USAGE ON SCHEMA public TO {DATASETS_READER}")
            await conn.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {DATASETS_READER}")
            await conn.execute(
                f"ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT ON TABLES TO {DATASETS_READER}"
            )
    finally:
        await conn.close()
