"""DPS-13 — the schema comes only from `signaling-migrate`: upgrade an empty database, downgrade
cleanly, and refuse (naming the role) when the pull-grant role does not exist."""

from __future__ import annotations

import asyncio

from dataplane_testing.signaling import run_migrate, sql
from signaling.migrate import head_revision

OBJECTS = (
    "SELECT c.relname, c.relkind::text AS relkind FROM pg_class c "
    "JOIN pg_namespace n ON n.oid=c.relnamespace "
    "WHERE n.nspname='public' AND c.relkind IN ('r','v') ORDER BY 1"
)


async def test_dps13_migrations_upgrade_an_empty_database_and_downgrade_cleanly(
    fresh_database: str, pull_grant_role: str
) -> None:
    assert await sql(fresh_database, OBJECTS) == []
    up = await asyncio.to_thread(run_migrate, fresh_database, "upgrade", "head")
    assert up.returncode == 0, up.stderr
    objects = {(r["relname"], r["relkind"]) for r in await sql(fresh_database, OBJECTS)}
    assert objects == {
        ("alembic_version", "r"),
        ("dps_data_flows", "r"),
        ("dps_control_planes", "r"),
        ("dps_outbox", "r"),
        ("dps_client_jtis", "r"),
        ("dps_callbacks", "r"),
        ("dps_pull_grants", "v"),
    }
    version = await sql(fresh_database, "SELECT version_num FROM alembic_version")
    assert [r["version_num"] for r in version] == [head_revision()]
    grants = await sql(
        fresh_database,
        "SELECT privilege_type FROM information_schema.role_table_grants "
        "WHERE table_name='dps_pull_grants' AND grantee=$1",
        pull_grant_role,
    )
    assert [g["privilege_type"] for g in grants] == ["SELECT"]
    # the read role's only other right: the first-use function (issue 13), no other routine
    routines = await sql(
        fresh_database,
        "SELECT routine_name, privilege_type FROM information_schema.role_routine_grants "
        "WHERE grantee=$1 AND routine_schema='public'",
        pull_grant_role,
    )
    assert [(r["routine_name"], r["privilege_type"]) for r in routines] == [
        ("dps_pull_token_used", "EXECUTE")
    ]

    down = await asyncio.to_thread(run_migrate, fresh_database, "downgrade", "base")
    assert down.returncode == 0, down.stderr
    assert {r["relname"] for r in await sql(fresh_database, OBJECTS)} == {"alembic_version"}
    again = await asyncio.to_thread(run_migrate, fresh_database, "upgrade", "head")
    assert again.returncode == 0, again.stderr


async def test_dps13_migration_fails_naming_a_missing_role(fresh_database: str) -> None:
    done = await asyncio.to_thread(run_migrate, fresh_database, "upgrade", "head", role="no_such_reader_role")
    assert done.returncode != 0
    assert "no_such_reader_role" in done.stderr
    assert "DPS_PULL_GRANT_ROLE" in done.stderr
    tables = await sql(fresh_database, OBJECTS)
    assert {r["relname"] for r in tables} <= {"alembic_version"}
