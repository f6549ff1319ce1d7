"""Issue 35, "readiness within its bound", on the gateway and the filter-resolver (driven
in-process against PostgreSQL, Valkey and Tansu servers of this test's own): Redis, then
PostgreSQL, then the broker are hung (SIGSTOP: connections accepted, nothing answered), one at a
time, and resumed; every /readyz answer of both services, while hung and while recovering, comes
back within READYZ_BOUND_S (plus a slack) in the state docs/faults.md gives that dependency.

Every server is this test's own and stopped in `finally`; a paused one is resumed by `paused`."""

from __future__ import annotations

import os
from pathlib import Path

from dataplane_contracts.topics import topic_specs
from dataplane_local import infra
from dataplane_local.procs import paused
from dataplane_service_kit.health import READYZ_BOUND_S
from dataplane_service_kit.topics_cli import create_topics
from dataplane_testing.databases import admin, create_database
from dataplane_testing.faults import raw_client, readyz_settles
from dataplane_testing.gateway import SEED, World
from dataplane_testing.resolver import resolver_beside
from filter_resolver.app import create_app as resolver_app
from query_gateway.app import create_app

BOUND_S = READYZ_BOUND_S + 0.25  # the slack: an in-process request's own overhead on a busy host
WHOLE = (200, {"status": "ready"})


def _failing(*names: str) -> tuple[int, dict[str, object]]:
    return 503, {"status": "unready", "error": "not_ready", "failing": list(names)}


async def test_issue35_readyz_within_bound_under_hung_redis_postgres_and_broker(
    world: World, tmp_path: Path
) -> None:
    pg = infra.start_postgres(tmp_path / "pg")
    redis = infra.start_redis(tmp_path / "redis")
    kafka = infra.start_kafka(tmp_path / "kafka")
    try:
        url = await create_database(pg.url)
        await admin(url, SEED)
        os.environ.setdefault("KAFKA_REPLICATION_FACTOR", "1")
        await create_topics(kafka.url, topic_specs())
        # an EDR gateway: the datasets database and the broker are required, Redis a capability
        gateway = create_app(
            world.settings(datasets_database_url=url, redis_url=redis.url, kafka_bootstrap_servers=kafka.url)
        )
        resolver = resolver_app(resolver_beside(kafka.url, redis.url, "issue35"))
        async with (
            gateway.router.lifespan_context(gateway),
            raw_client(gateway) as gw,
            resolver.router.lifespan_context(resolver),
            raw_client(resolver) as rs,
        ):
            # the resolver is unready until it holds partitions: "before" is its starting answer
            await readyz_settles(gw, BOUND_S, WHOLE, before=WHOLE)
            await readyz_settles(rs, BOUND_S, WHOLE, before=_failing("kafka"), attempts=300)
            # (process, the gateway's answer while it is hung, the resolver's)
            faults = (
                (redis.pid, (200, {"status": "ready", "degraded": ["redis"]}), _failing("redis")),
                (pg.pid, _failing("datasets_db"), WHOLE),  # the resolver opens no database here
                (kafka.pid, _failing("kafka"), _failing("kafka")),
            )
            for pid, gw_hung, rs_hung in faults:
                with paused(pid):
                    await readyz_settles(gw, BOUND_S, gw_hung, before=WHOLE)
                    await readyz_settles(rs, BOUND_S, rs_hung, before=WHOLE)
                # resumed: back to whole, every answer on the way still within the bound
                await readyz_settles(gw, BOUND_S, WHOLE, before=gw_hung, attempts=300)
                await readyz_settles(rs, BOUND_S, WHOLE, before=rs_hung, attempts=300)
    finally:
        kafka.stop()
        redis.stop()
        pg.stop()
