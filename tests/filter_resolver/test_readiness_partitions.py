"""Readiness follows the partitions (issue 4: "the service is ready only once it holds its
partitions"), through the real broker: two `filter-resolver` processes join one consumer group on a
request topic with a single partition. Both reach the broker and join the group; the member left
without a partition answers 503 naming kafka, the holder answers 200, and when the holder leaves,
the other takes the partition over and becomes ready."""

from __future__ import annotations

import dataclasses
import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from dataplane_testing.polling import eventually
from dataplane_testing.processes import ServiceProcess
from dataplane_testing.resolver import module_topics, resolver_env, start_resolver
from dataplane_testing.topics import make_topics

pytestmark = pytest.mark.e2e

UNREADY_KAFKA = {"status": "unready", "error": "not_ready", "failing": ["kafka"]}


async def _readyz(resolver: ServiceProcess) -> tuple[int, Any]:
    async with httpx.AsyncClient() as client:
        response = await client.get(resolver.url + "/readyz", timeout=5)
    return response.status_code, response.json()


def _assignments(resolver: ServiceProcess) -> list[list[int]]:
    """Every `partitions_assigned` the member logged: one per completed join of the group."""
    out: list[list[int]] = []
    for line in resolver.stderr().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("event") == "partitions_assigned":
            out.append(list(entry["partitions"]))
    return out


async def test_a_member_without_partitions_is_unready_while_the_holder_is_ready(
    kafka_bootstrap: str, redis_server_url: str, tmp_path: Path
) -> None:
    suffix = uuid.uuid4().hex[:8]
    specs, request_topic, _reply_topic = module_topics(suffix)
    # one partition for two members: one of them is in the group but holds nothing
    specs = [dataclasses.replace(s, partitions=1) if s.name == request_topic else s for s in specs]
    await make_topics(kafka_bootstrap, specs)
    env = resolver_env(
        kafka_bootstrap, redis_server_url, request_topic, RESOLVER_GROUP_ID=f"test-readiness-{suffix}"
    )
    resolvers = [start_resolver(env, tmp_path, f"resolver-{i}") for i in range(2)]
    try:

        async def settled() -> bool:
            # both joined (each logged an assignment); the latest assignments split the one
            # partition between them: exactly one holder, one member with none
            logged = [_assignments(r) for r in resolvers]
            if not all(logged):
                return False
            held = [await r.metric("filter_resolver_assigned_partitions") for r in resolvers]
            return sorted(held) == [0.0, 1.0] and sorted(len(a[-1]) for a in logged) == [0, 1]

        if not await eventually(settled, timeout=90, interval=0.2):
            logs = "\n".join(r.stderr()[-3000:] for r in resolvers)
            pytest.fail(f"the group did not settle on one holder and one idle member:\n{logs}")
        holder, idle = sorted(resolvers, key=lambda r: len(_assignments(r)[-1]), reverse=True)
        assert _assignments(idle)[-1] == []  # in the group, assigned nothing
        assert _assignments(holder)[-1] == [0]

        async def holder_ready() -> bool:
            return (await _readyz(holder))[0] == 200

        assert await eventually(holder_ready, timeout=30, interval=0.1)
        assert await _readyz(holder) == (200, {"status": "ready"})
        # the idle member reaches the broker and Redis; only the partitions are missing
        assert await _readyz(idle) == (503, UNREADY_KAFKA)
        assert await idle.metric("filter_resolver_assigned_partitions") == 0.0

        # the holder leaves the group: the partition moves, and readiness moves with it
        holder.stop()

        async def idle_took_over() -> bool:
            return (await _readyz(idle))[0] == 200

        if not await eventually(idle_took_over, timeout=90, interval=0.2):
            pytest.fail(f"the remaining member never became ready:\n{idle.stderr()[-3000:]}")
        assert _assignments(idle)[-1] == [0]
        assert await idle.metric("filter_resolver_assigned_partitions") == 1.0
    finally:
        for r in resolvers:
            r.stop()
