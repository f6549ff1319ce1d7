"""Support of the query-gateway tests, imported by conftest and the test modules: the test world
(settings, tokens), the gateway driven in-process, and a topic tail."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from aiokafka import AIOKafkaConsumer, TopicPartition

from dataplane_local.doubles.ds_connector import DsConnectorDouble
from dataplane_local.doubles.oidc import OidcIssuer
from query_gateway.app import create_app
from query_gateway.settings import GatewaySettings

CATALOGUE = Path(__file__).with_name("catalogue.yaml")
AUDIENCE = "svc-query-gateway"
CLIENT_ID, CLIENT_SECRET = "query-gateway", "gateway-client-secret"
PROVIDER = "did:web:provider.example"
CONSUMER = "did:web:consumer.example"
AGREEMENT = "agr-1"
CACHE_SECRET = "test-cache-key-secret-0123456789"

SEED = """
CREATE TABLE readings (id int PRIMARY KEY, pod text NOT NULL, value int NOT NULL);
INSERT INTO readings VALUES (1, 'pod-1', 10), (2, 'pod-2', 20), (3, 'pod-3', 30);
CREATE TABLE stats (id int PRIMARY KEY, label text NOT NULL);
INSERT INTO stats VALUES (1, 'a'), (2, 'b');
CREATE TABLE notes (id int PRIMARY KEY, owner text NOT NULL, body text NOT NULL);
INSERT INTO notes VALUES (1, 'user-1', 'n1'), (2, 'user-2', 'n2'), (3, 'user-1', 'n3');
CREATE TABLE assets (id int PRIMARY KEY, org text NOT NULL, name text NOT NULL);
INSERT INTO assets VALUES (1, 'org-a', 'a1'), (2, 'org-b', 'b1'), (3, 'org-c', 'c1');
CREATE TABLE members (id int PRIMARY KEY, org text NOT NULL);
INSERT INTO members VALUES (1, 'org-a'), (2, 'org-b');
CREATE TABLE unscoped (id int PRIMARY KEY);
INSERT INTO unscoped VALUES (1), (2);
"""


@dataclass
class World:
    datasets_url: str
    issuer: OidcIssuer
    ds: DsConnectorDouble
    ds_url: str
    kafka: str
    redis_url: str

    def settings(self, **overrides: Any) -> GatewaySettings:
        values: dict[str, Any] = {
            "catalogue_path": str(CATALOGUE),
            "datasets_database_url": self.datasets_url,
            "redis_url": self.redis_url,
            "kafka_bootstrap_servers": self.kafka,
            "kafka_fetch_max_wait_ms": 10,
            "kafka_enable_idempotence": False,
            "row_filters_cache_key_secret": CACHE_SECRET,
            "row_filters_resolve_timeout_ms": 3000,
            "celine_oidc_base_url": self.issuer.base_url,
            "celine_oidc_audience": AUDIENCE,
            "celine_oidc_client_id": CLIENT_ID,
            "celine_oidc_client_secret": CLIENT_SECRET,
            "edr_enabled": True,
            "connector_internal_url": self.ds_url,
        }
        values.update(overrides)
        return GatewaySettings(**values)

    def user_token(self, sub: str = "user-1", **claims: Any) -> str:
        body = {"sub": sub, "preferred_username": f"name-of-{sub}", "email": f"{sub}@mail.example"}
        body.update(claims)
        return self.issuer.mint(body, audience=AUDIENCE)

    def service_token(self, scope: str = "dataset.query") -> str:
        return self.issuer.service_token("some-service", audience=AUDIENCE, scope=scope)

    def edr(self, consumer: str = CONSUMER) -> str:
        return self.ds.mint_edr(consumer, AGREEMENT)


def ds_policy(datasets: list[dict[str, Any]], consents: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "participant_id": PROVIDER,
        "agreements": {AGREEMENT: {"consumer": CONSUMER, "datasets": datasets}},
        "consents": consents or {},
    }


@contextlib.asynccontextmanager
async def running_gateway(settings: GatewaySettings) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            yield client


class TopicTail:
    """Reads a topic from its current end on every partition (manual assignment, no group)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self._bootstrap, self._topic = bootstrap, topic
        self._consumer: AIOKafkaConsumer | None = None

    async def __aenter__(self) -> TopicTail:
        consumer = AIOKafkaConsumer(bootstrap_servers=self._bootstrap, group_id=None, fetch_max_wait_ms=10)
        await consumer.start()
        partitions = consumer.partitions_for_topic(self._topic)
        if not partitions:
            await consumer._client.force_metadata_update()
            partitions = consumer.partitions_for_topic(self._topic) or set()
        tps = [TopicPartition(self._topic, p) for p in sorted(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_end(*tps)
        for tp in tps:
            await consumer.position(tp)
        self._consumer = consumer
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._consumer is not None
        await self._consumer.stop()

    async def read(self, count: int, timeout: float = 20.0) -> list[Any]:
        assert self._consumer is not None
        out: list[Any] = []
        async with asyncio.timeout(timeout):
            while len(out) < count:
                batches = await self._consumer.getmany(timeout_ms=200)
                for records in batches.values():
                    out.extend(records)
        return out

    async def quiet(self, wait: float = 0.5) -> list[Any]:
        """Whatever arrives within `wait` seconds (used to prove nothing was published)."""
        assert self._consumer is not None
        batches = await self._consumer.getmany(timeout_ms=int(wait * 1000))
        return [r for records in batches.values() for r in records]
