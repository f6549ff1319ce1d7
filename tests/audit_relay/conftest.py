"""Fixtures for the audit-relay: one relay process for the whole folder (a consumer-group join
costs ~3 s on the local broker), on topics of its own, with ds connector doubles for two providers
and a default connector, and an OIDC issuer double."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import tracemalloc  # noqa: F401 - see below
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from dataplane_local.doubles.oidc import start_oidc_issuer
from dataplane_testing import audit_relay as h

# Imported eagerly: a ResourceWarning collected while pytest lazily imports tracemalloc (to
# describe it) crashes pytest's unraisable hook with a circular-import error.


@pytest.fixture(scope="session")
async def producer(kafka_bootstrap: str) -> AsyncIterator[AIOKafkaProducer]:
    p = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", linger_ms=0)
    await p.start()
    yield p
    await p.stop()


@pytest.fixture(scope="session")
async def harness(kafka_bootstrap: str, producer: AIOKafkaProducer) -> AsyncIterator[h.Harness]:
    suffix = uuid.uuid4().hex[:8]
    topic, dlq_topic = f"test.audit.{suffix}", f"test.audit.{suffix}.dlq"
    await h.make_topics(kafka_bootstrap, topic, dlq_topic)
    issuer, issuer_server = start_oidc_issuer(clients={h.CLIENT_ID: h.CLIENT_SECRET})
    a = h.start_connector(h.PROVIDER_A, issuer)
    b = h.start_connector(h.PROVIDER_B, issuer)
    default = h.start_connector(h.DEFAULT_PROVIDER, issuer)
    urls = {h.PROVIDER_A: a.server.url, h.PROVIDER_B: b.server.url}
    env = h.relay_env(
        kafka_bootstrap, topic, dlq_topic, f"relay-{suffix}", issuer, urls, default_url=default.server.url
    )
    workdir = Path(tempfile.mkdtemp(prefix="audit-relay-"))
    relay = h.relay_process(env, workdir / "relay.log")
    harness = h.Harness(
        kafka_bootstrap, topic, dlq_topic, a, b, issuer, issuer_server, relay, producer, default
    )
    reader = asyncio.create_task(h.read_dlq(kafka_bootstrap, dlq_topic, harness.dlq, harness.dlq_headers))
    relay.start()
    try:
        await relay.wait_ready()
        yield harness
    finally:
        relay.stop()
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        for server in (a.server, b.server, default.server, issuer_server):
            server.stop()
