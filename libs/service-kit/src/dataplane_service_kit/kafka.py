"""The one Kafka producer configuration of every service: the gateway's disclosures and plan
requests, the resolver's replies, the relay's dead letters, signaling's flow events.

`acks="all"` and idempotence (KAFKA_ENABLE_IDEMPOTENCE; the local Tansu broker needs it off):
a send is acknowledged only once every in-sync replica has it, and a retried send is not written
twice, which is what "no row leaves before its disclosure is durable" (RF-10) rests on.
`linger_ms=0`: every send is a request that someone waits for (a query's disclosure, a plan
request, a reply), never a batch worth delaying. The shared settings carry no security options
(SASL, TLS): the chart's brokers are reached in-cluster; adding them is adding them here."""

from __future__ import annotations

import contextlib

from aiokafka import AIOKafkaProducer

from dataplane_contracts.settings import KafkaSettings
from dataplane_service_kit.shutdown import stop_on_exit

# a producer's stop flushes what it still holds: longer than another part's stop, and still
# inside the pod's termination grace
KAFKA_STOP_BOUND_S = 10.0


def kafka_producer(settings: KafkaSettings) -> AIOKafkaProducer:
    """A producer not yet started (the relay starts its own, retrying while no broker answers)."""
    return AIOKafkaProducer(
        bootstrap_servers=settings.kafka_bootstrap_servers,
        acks="all",
        enable_idempotence=settings.kafka_enable_idempotence,
        linger_ms=0,
    )


async def started_producer(
    settings: KafkaSettings, stack: contextlib.AsyncExitStack[bool | None]
) -> AIOKafkaProducer:
    """A started producer whose stop (bounded, KAFKA_STOP_BOUND_S) is on the lifespan's stack."""
    producer = kafka_producer(settings)
    await producer.start()
    stop_on_exit(stack, "kafka_producer", producer.stop, KAFKA_STOP_BOUND_S)
    return producer
