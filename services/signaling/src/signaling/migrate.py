"""`signaling-migrate [upgrade [REV] | downgrade REV | current]` — the only way the schema changes.

Reads DATABASE_URL (postgresql://… accepted) and DPS_PULL_GRANT_ROLE (the role granted SELECT on
the pull-grant view; it must exist). The service itself never migrates: it refuses to start when
the database is not at head (`check_at_head`)."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from dataplane_contracts.dps import DEFAULT_PULL_GRANT_ROLE
from signaling.settings import async_database_url

MIGRATIONS = Path(__file__).parent / "migrations"
# alembic announces each of its plugins at INFO when the head is looked up, on every start: noise
# in the service's log; its warnings and errors still show
logging.getLogger("alembic").setLevel(logging.WARNING)


def alembic_config(database_url: str, pull_grant_role: str = DEFAULT_PULL_GRANT_ROLE) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["database_url"] = async_database_url(database_url)
    cfg.attributes["pull_grant_role"] = pull_grant_role
    return cfg


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config("postgresql://unused/x")).get_current_head()
    assert head is not None
    return head


class DatabaseNotAtHead(RuntimeError):
    pass


async def check_at_head(engine: AsyncEngine) -> None:
    """Raise unless the database's revision is the migrations' head."""
    head = head_revision()
    async with engine.connect() as conn:
        exists = (await conn.execute(text("SELECT to_regclass('alembic_version')"))).scalar()
        current = None
        if exists is not None:
            current = (await conn.execute(text("SELECT version_num FROM alembic_version"))).scalar()
    if current != head:
        raise DatabaseNotAtHead(
            f"the flows database is at revision {current or 'none'}, not at head {head}: "
            "run signaling-migrate (upgrade head) first"
        )


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv) or ["upgrade", "head"]
    url = os.environ.get("DATABASE_URL")
    if not url:
        print("invalid configuration: DATABASE_URL: required", file=sys.stderr)
        raise SystemExit(2)
    role = os.environ.get("DPS_PULL_GRANT_ROLE") or DEFAULT_PULL_GRANT_ROLE
    cfg = alembic_config(url, role)
    verb = args[0]
    try:
        if verb == "upgrade":
            command.upgrade(cfg, args[1] if len(args) > 1 else "head")
        elif verb == "downgrade" and len(args) > 1:
            command.downgrade(cfg, args[1])
        elif verb == "current":
            command.current(cfg)
        else:
            print("usage: signaling-migrate [upgrade [REV] | downgrade REV | current]", file=sys.stderr)
            raise SystemExit(2)
    except RuntimeError as exc:
        print(f"signaling-migrate: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
