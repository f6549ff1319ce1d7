"""Issue 31: the one Kafka producer of the four services (dataplane_service_kit.kafka), against
the real broker of the test session."""

from __future__ import annotations

import contextlib

import pytest
from aiokafka.errors import ProducerClosed

from dataplane_contracts.settings import KafkaSettings
from dataplane_contracts.topics import TopicSpec
from dataplane_service_kit.kafka import started_producer
from dataplane_testing.topics import make_topics, read_to_end


def _settings(bootstrap: str) -> KafkaSettings:
    # the local broker (Tansu) takes no idempotent producer, as every test stack sets
    return KafkaSettings(kafka_bootstrap_servers=bootstrap, kafka_enable_idempotence=False)


async def test_issue31_a_started_producer_writes_acknowledged_records_and_stops_with_the_stack(
    kafka_bootstrap: str, unique: str
) -> None:
    topic = f"issue31-producer-{unique}"
    await make_topics(kafka_bootstrap, [TopicSpec(topic, 1)])
    async with contextlib.AsyncExitStack() as stack:
        producer = await started_producer(_settings(kafka_bootstrap), stack)
        sent = await producer.send_and_wait(topic, b"disclosure", key=b"provider")
        assert sent.offset >= 0  # acknowledged (acks=all) before send_and_wait returned
    records = await read_to_end(kafka_bootstrap, [topic])
    assert [(r.key, r.value) for r in records] == [(b"provider", b"disclosure")]
    with pytest.raises(ProducerClosed):  # stopped when the stack closed
        await producer.send_and_wait(topic, b"late")
