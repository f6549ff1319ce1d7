"""The error table and the topics, as docs/wire-contracts.md lists them."""

from __future__ import annotations

import asyncio
import json

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from dataplane_contracts.errors import ERROR_CODES, STATUS
from dataplane_contracts.events import DisclosureRecorded
from dataplane_contracts.topics import AUDIT_DISCLOSURES, topic_specs
from dataplane_service_kit.topics_cli import create_topics


def test_every_code_has_its_status() -> None:
    assert set(ERROR_CODES) == set(STATUS)
    assert STATUS["row_filter_unreadable"] == 502 and STATUS["row_filter_invalid"] == 500
    assert STATUS["row_policy_denied"] == 403 and STATUS["audit_unavailable"] == 503
    assert STATUS["body_too_large"] == 413
    assert STATUS["sql_too_long"] == STATUS["invalid_text"] == STATUS["invalid_body"] == 400


async def test_topics_created_idempotently_and_event_round_trips_with_headers(kafka_bootstrap: str) -> None:
    specs = topic_specs()
    await create_topics(kafka_bootstrap, specs)
    assert await create_topics(kafka_bootstrap, specs) == []  # a second run creates nothing

    event = DisclosureRecorded(
        provider_participant="did:web:p.example",
        consumer_id="did:web:c.example",
        agreement_id="agr",
        dataset_id="d",
        row_count=2,
        authorized_subject_ids=None,
    )
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:
        meta = await producer.send_and_wait(
            AUDIT_DISCLOSURES,
            event.model_dump_json().encode(),
            key=b"did:web:p.example",
            headers=[("traceparent", b"00-0123456789abcdef0123456789abcdef-0123456789abcdef-01")],
        )
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, fetch_max_wait_ms=10)
    await consumer.start()
    try:
        tp = TopicPartition(AUDIT_DISCLOSURES, meta.partition)
        consumer.assign([tp])
        consumer.seek(tp, meta.offset)
        record = await asyncio.wait_for(consumer.getone(), 20)
    finally:
        await consumer.stop()
    assert DisclosureRecorded.model_validate(json.loads(record.value)) == event
    assert dict(record.headers)["traceparent"].startswith(b"00-0123456789abcdef")
