"""Issue 35, "readiness within its bound", on signaling (driven in-process against a PostgreSQL
server and a Tansu broker of this test's own; signaling uses no Redis): PostgreSQL, then the
broker, are hung (SIGSTOP) and resumed; every /readyz answer, while hung and while recovering,
comes back within READYZ_BOUND_S (plus a slack), 503 naming the hung dependency, then 200.

Every server is this test's own and stopped in `finally`; a paused one is resumed by `paused`."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from dataplane_contracts.topics import topic_specs
from dataplane_local import infra
from dataplane_local.doubles.oidc import OidcIssuer
from dataplane_local.procs import paused
from dataplane_service_kit.health import READYZ_BOUND_S
from dataplane_service_kit.topics_cli import create_topics
from dataplane_testing import signaling as support
from dataplane_testing.databases import create_database
from dataplane_testing.faults import readyz_settles

BOUND_S = READYZ_BOUND_S + 0.25  # the slack: an in-process request's own overhead on a busy host
WHOLE = (200, {"status": "ready"})


def _failing(name: str) -> tuple[int, dict[str, object]]:
    return 503, {"status": "unready", "error": "not_ready", "failing": [name]}


async def test_issue35_readyz_within_bound_under_hung_postgres_and_broker(
    tmp_path: Path, oidc: OidcIssuer, signing_pem: str
) -> None:
    pg = infra.start_postgres(tmp_path / "pg")
    kafka = infra.start_kafka(tmp_path / "kafka")
    try:
        url = await create_database(pg.url)
        await support.ensure_pull_grant_role(pg.url)
        migrated = await asyncio.to_thread(support.run_migrate, url, "upgrade", "head")
        assert migrated.returncode == 0, migrated.stderr
        os.environ.setdefault("KAFKA_REPLICATION_FACTOR", "1")
        await create_topics(kafka.url, topic_specs())
        values = support.settings_values(url, kafka.url, oidc.base_url, signing_pem)
        async with support.run_app(values) as app:
            await readyz_settles(app.client, BOUND_S, WHOLE, before=WHOLE)
            for pid, hung in ((pg.pid, _failing("database")), (kafka.pid, _failing("kafka"))):
                with paused(pid):
                    await readyz_settles(app.client, BOUND_S, hung, before=WHOLE)
                await readyz_settles(app.client, BOUND_S, WHOLE, before=hung, attempts=300)
    finally:
        kafka.stop()
        pg.stop()
