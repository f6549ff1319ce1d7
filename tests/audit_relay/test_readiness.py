"""Readiness: the relay is ready once it consumes, and unready once the broker has been unreachable
for longer than AUDIT_RELAY_UNREADY_GRACE_S (ds's side is proven in test_outage/test_credentials);
a connector's failure stops counting once this replica holds no more work for that connector."""

from __future__ import annotations

import asyncio
import os
import signal
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from audit_relay.health import Health
from dataplane_local import infra
from dataplane_local.procs import paused
from dataplane_service_kit.health import READYZ_BOUND_S
from dataplane_testing import audit_relay as h
from dataplane_testing.faults import readyz_settles

BOUND_S = READYZ_BOUND_S + 0.25  # the slack: a request's own overhead on a busy host


async def test_unready_naming_the_broker_once_it_is_gone_longer_than_the_grace(harness: h.Harness) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="audit-relay-broker-"))
    broker = infra.start_kafka(workdir / "kafka")  # a broker of its own, to stop under the relay
    suffix = uuid.uuid4().hex[:8]
    topic, dlq_topic = f"test.audit.ready.{suffix}", f"test.audit.ready.{suffix}.dlq"
    relay = None
    try:
        await h.make_topics(broker.url, topic, dlq_topic)
        urls = {h.PROVIDER_A: harness.a.server.url}
        env = h.relay_env(broker.url, topic, dlq_topic, f"relay-ready-{suffix}", harness.issuer, urls)
        relay = h.relay_process(env, workdir / "relay.log")
        relay.start()
        await relay.wait_ready()
        os.kill(broker.pid, signal.SIGKILL)  # gone at once, as in a crash

        async def broker_failing() -> bool:
            r = relay.readyz() if relay is not None else None
            return r is not None and r.status_code == 503 and "broker" in r.json()["failing"]

        await h.wait_for(broker_failing, 30, "unready naming the broker")
    finally:
        if relay is not None:
            relay.stop()
        broker.stop()  # reaps it


def test_ds_failures_count_only_after_the_grace_and_a_refused_credential_at_once() -> None:
    health = Health(grace_s=3600)
    assert not health.broker_ready()  # not consuming yet
    health.consuming = True
    assert health.broker_ready()
    health.ds_failing("http://ds-a")
    assert health.ds_ready()  # within the grace
    health.ds_auth_refused("http://ds-a")
    assert not health.ds_auth_ready()
    health.ds_answered("http://ds-a", accepted=True)
    assert health.ds_auth_ready() and health.ds_ready()

    strict = Health(grace_s=0)
    strict.consuming = True
    strict.ds_failing("http://ds-b")
    time.sleep(0.01)
    assert not strict.ds_ready() and not strict.broker_ready()
    strict.ds_answered("http://ds-b", accepted=False)  # a 4xx: reachable, though refusing
    assert strict.ds_ready()


def test_a_forgotten_connector_no_longer_counts_for_readiness() -> None:
    health = Health(grace_s=0)
    health.consuming = True
    health.ds_failing("http://ds-a")
    health.ds_auth_refused("http://ds-b")
    time.sleep(0.01)
    assert not health.ds_ready() and not health.ds_auth_ready()
    health.forget("http://ds-a")
    health.forget("http://ds-b")
    assert health.ds_ready() and health.ds_auth_ready()


# The other replica's member id sorts before the relay's ("aiokafka-…"), so both of aiokafka's
# assignors (round robin, range) give it partition 0; the test asserts it rather than trusting it.
OTHER_REPLICA_CLIENT_ID = "0-other-replica"
MOVED_PARTITION = 0


@pytest.mark.parametrize(("status", "dependency"), [(503, "ds"), (403, "ds_auth")])
async def test_ready_again_once_the_partition_waiting_on_a_failing_connector_moves_to_another_replica(
    harness: h.Harness, status: int, dependency: str
) -> None:
    tp = TopicPartition(harness.topic, MOVED_PARTITION)
    ev = h.event(h.PROVIDER_A)
    harness.a.double.set_fault(endpoint="audit", status=status)
    try:
        await harness.producer.send_and_wait(
            harness.topic, h.json_bytes(ev), key=h.PROVIDER_A.encode(), partition=MOVED_PARTITION
        )
        await h.wait_for(lambda: _failing(harness, dependency), 30, f"unready naming {dependency}")

        other = AIOKafkaConsumer(
            harness.topic,
            bootstrap_servers=harness.bootstrap,
            group_id=harness.relay.env["AUDIT_RELAY_GROUP_ID"],
            client_id=OTHER_REPLICA_CLIENT_ID,
            enable_auto_commit=False,  # it only holds the partition; the record stays undelivered
            session_timeout_ms=6000,
            heartbeat_interval_ms=500,
        )
        await other.start()
        try:
            await h.wait_for(lambda: tp in other.assignment(), 60, "the other replica owning the partition")
            # ds still refuses: only losing the partition can have made the relay ready again
            await harness.relay.wait_ready(60)
            assert harness.a.accepted_ids([ev["event_id"]]) == []
        finally:
            await other.stop()

        # the partition comes back, the record is tried again and the failure counts again
        await h.wait_for(lambda: _failing(harness, dependency), 60, f"unready naming {dependency} again")
    finally:
        harness.a.double.clear_faults()
    # nothing was lost on the way
    await harness.wait_accepted([ev])
    await harness.relay.wait_ready(30)


async def _failing(harness: h.Harness, dependency: str) -> bool:
    r = await asyncio.to_thread(harness.relay.readyz)
    return r is not None and r.status_code == 503 and dependency in r.json()["failing"]


async def test_issue35_readyz_within_bound_under_a_paused_broker(harness: h.Harness) -> None:
    """Issue 35, "readiness within its bound", on the relay: the broker hung (SIGSTOP, so every
    request to it waits rather than fails) and resumed. Every /readyz answer, while hung and while
    recovering, comes back within READYZ_BOUND_S (plus a slack): ready within the grace, then 503
    naming the broker, then ready again once the broker answers."""
    workdir = Path(tempfile.mkdtemp(prefix="audit-relay-paused-"))
    broker = infra.start_kafka(workdir / "kafka")
    suffix = uuid.uuid4().hex[:8]
    topic, dlq_topic = f"test.audit.paused.{suffix}", f"test.audit.paused.{suffix}.dlq"
    relay = None
    whole = (200, {"status": "ready"})
    hung = (503, {"status": "unready", "error": "not_ready", "failing": ["broker"]})
    try:
        await h.make_topics(broker.url, topic, dlq_topic)
        urls = {h.PROVIDER_A: harness.a.server.url}
        env = h.relay_env(broker.url, topic, dlq_topic, f"relay-paused-{suffix}", harness.issuer, urls)
        relay = h.relay_process(env, workdir / "relay.log")
        relay.start()
        await relay.wait_ready()
        async with httpx.AsyncClient(base_url=relay.url) as client:
            await readyz_settles(client, BOUND_S, whole, before=whole)
            with paused(broker.pid):
                await readyz_settles(client, BOUND_S, hung, before=whole, attempts=300)
            await readyz_settles(client, BOUND_S, whole, before=hung, attempts=300)
    finally:
        if relay is not None:
            relay.stop()
        broker.stop()
