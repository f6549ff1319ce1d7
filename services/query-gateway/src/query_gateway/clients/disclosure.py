"""Disclosure audit: nothing served without a record (RF-10). One
`DisclosureRecorded` per disclosed dataset, keyed by provider participant, acknowledged by the
broker (acks=all) within AUDIT_PUBLISH_TIMEOUT_MS; otherwise 503 audit_unavailable, no rows."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from dataplane_contracts.events import DisclosureRecorded
from dataplane_contracts.topics import AUDIT_DISCLOSURES
from dataplane_service_kit.errors import ServiceError
from dataplane_service_kit.logs import get_logger
from dataplane_service_kit.telemetry import kafka_headers
from query_gateway.metrics import Metrics

log = get_logger("query_gateway.disclosure")


class DisclosurePublisher:
    def __init__(self, producer: AIOKafkaProducer, timeout_ms: int, metrics: Metrics | None = None) -> None:
        self._metrics = metrics if metrics is not None else Metrics()
        self._producer = producer
        self._timeout = timeout_ms / 1000

    async def publish(self, events: Sequence[DisclosureRecorded]) -> None:
        if not events:
            return
        headers = kafka_headers()
        try:
            async with asyncio.timeout(self._timeout):
                await asyncio.gather(
                    *(
                        self._producer.send_and_wait(
                            AUDIT_DISCLOSURES,
                            e.model_dump_json().encode(),
                            key=(e.provider_participant or "").encode(),
                            headers=headers,
                        )
                        for e in events
                    )
                )
        except (TimeoutError, KafkaError) as exc:
            # the event may still become durable later: ds then holds a record of a disclosure
            # that did not happen — the safe direction
            log.error("disclosure_not_acknowledged_rows_withheld", error=type(exc).__name__)
            raise ServiceError(
                "audit_unavailable", "disclosure could not be recorded; no rows served"
            ) from None
        self._metrics.disclosures.inc(len(events))
