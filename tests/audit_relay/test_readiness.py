"""Readiness: the relay is ready once it consumes, and unready once the broker has been unreachable
for longer than AUDIT_RELAY_UNREADY_GRACE_S (ds's side is proven in test_outage/test_credentials)."""

from __future__ import annotations

import os
import signal
import tempfile
import time
import uuid
from pathlib import Path

import audit_relay_harness as h

from audit_relay.health import Health
from dataplane_local import infra


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
        relay = h.RelayProcess(env, workdir / "relay.log")
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
