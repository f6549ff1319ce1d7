"""Support of the query-gateway tests, imported by conftest and the test modules: the test world
(settings, tokens), the gateway driven in-process, and a topic tail."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import jwt
import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from prometheus_client.parser import text_string_to_metric_families

from dataplane_contracts.events import PlanRequest, PlanResolved
from dataplane_contracts.plans import ClaimCheck, Plan, redis_claim_key, redis_one_shot_key, redis_plan_key
from dataplane_contracts.topics import PLAN_REQUESTS
from dataplane_local.doubles.ds_connector import DsConnectorDouble
from dataplane_local.doubles.oidc import OidcIssuer
from dataplane_local.timeouts import scaled
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


# signaling's token key as the DPS pull tests sign with it, and its public half for the gateway
KEY = ec.generate_private_key(ec.SECP256R1())
PUBLIC_PEM = (
    KEY.public_key()
    .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    .decode()
)


async def started_grant(flows_url: str, dataset: str = "stats") -> str:
    """A STARTED flow's pull grant of the agreement between PROVIDER and CONSUMER; its token id."""
    jti = str(uuid.uuid4())
    conn = await asyncpg.connect(flows_url)
    try:
        await conn.execute(
            "INSERT INTO dps_pull_grants VALUES ($1, $2, 'STARTED', $3, $4, $5, $6)",
            jti,
            f"flow-{jti[:8]}",
            AGREEMENT,
            dataset,
            PROVIDER,
            CONSUMER,
        )
    finally:
        await conn.close()
    return jti


def pull_token(jti: str, aud: str = CONSUMER, iss: str = PROVIDER, key: Any = KEY) -> str:
    claims = {"jti": jti, "iss": iss, "sub": iss, "aud": aud, "iat": int(time.time())}
    return jwt.encode(claims, key, algorithm="ES256")


# the pull-grant view in the shape signaling publishes it
PULL_GRANTS_DDL = (
    "CREATE TABLE dps_pull_grants (token_id text PRIMARY KEY, flow_id text, state text,"
    " agreement_id text, dataset_id text, participant_id text, counter_party_id text,"
    " grant_extensions text)"
)


@contextlib.asynccontextmanager
async def scratch_database(postgres_url: str, schema: str) -> AsyncIterator[str]:
    """A database of its own on the session's server, created with `schema`, dropped after."""
    name = f"scratch_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(postgres_url)
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.close()
    url = f"{postgres_url.rpartition('/')[0]}/{name}"
    try:
        conn = await asyncpg.connect(url)
        try:
            await conn.execute(schema)
        finally:
            await conn.close()
        yield url
    finally:
        admin = await asyncpg.connect(postgres_url)
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


@contextlib.asynccontextmanager
async def running_gateway(settings: GatewaySettings) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            yield client


class TopicTail:
    """Reads a topic from its current end on every partition (manual assignment, no group).

    Only records created after the tail opened are returned: the local broker may report an end
    offset just short of an event acknowledged a moment earlier, which would otherwise reach the
    next test as if it had been published there."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self._bootstrap, self._topic = bootstrap, topic
        self._consumer: AIOKafkaConsumer | None = None
        self._opened_ms = 0

    async def __aenter__(self) -> TopicTail:
        self._opened_ms = int(time.time() * 1000)  # producer CreateTime is wall-clock ms
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

    def _fresh(self, batches: dict[Any, list[Any]]) -> list[Any]:
        return [r for records in batches.values() for r in records if r.timestamp >= self._opened_ms]

    async def read(self, count: int, timeout: float = 20.0) -> list[Any]:
        return await self.read_where(count, lambda _r: True, timeout)

    async def read_where(
        self, count: int, predicate: Callable[[Any], bool], timeout: float = 20.0
    ) -> list[Any]:
        """The first `count` records that satisfy `predicate` (others on the topic are skipped)."""
        assert self._consumer is not None
        out: list[Any] = []
        async with asyncio.timeout(scaled(timeout)):
            while len(out) < count:
                batches = await self._consumer.getmany(timeout_ms=200)
                out.extend(r for r in self._fresh(batches) if predicate(r))
        return out

    async def quiet(self, wait: float = 0.5) -> list[Any]:
        """Whatever arrives within `wait` seconds (used to prove nothing was published)."""
        assert self._consumer is not None
        return self._fresh(await self._consumer.getmany(timeout_ms=int(wait * 1000)))


# ---------------------------------------------------------------------------- extended catalogue
# Datasets only a few clauses need, appended to the shared catalogue for a dedicated gateway (the
# shared one keeps its catalogue): a filter without `column`, two ids one suffix reference
# cannot tell apart, and caller-owned rows offered in the dataspace.
EXTRA_DATASETS = """
  - id: no_column           # RF-04: a subject_key_match without column
    table: readings
    access_level: open
    expose: true
    dataspace_expose: true
    row_filters:
      person: {handler: subject_key_match, args: {key_type: pod}}
      organization: {handler: allow_all, binds: organization}
  - id: north.energy.stats  # `energy.stats` names both: ambiguous
    table: public.stats
    access_level: open
    expose: true
    row_filters:
      person: {handler: allow_all, binds: person}
      organization: {handler: allow_all, binds: organization}
  - id: south.energy.stats
    table: public.stats
    access_level: open
    expose: true
    row_filters:
      person: {handler: allow_all, binds: person}
      organization: {handler: allow_all, binds: organization}
  - id: shared_notes        # direct_user_match on the dataspace path
    table: notes
    access_level: open
    expose: true
    dataspace_expose: true
    row_filters:
      person: {handler: direct_user_match, args: {column: owner}}
      organization: {handler: allow_all, binds: organization}
"""


def extended_catalogue(directory: Path) -> str:
    path = directory / "catalogue-extended.yaml"
    path.write_text(CATALOGUE.read_text().rstrip("\n") + "\n" + EXTRA_DATASETS)
    return str(path)


# ---------------------------------------------------------------------------- metrics
def metric(client_text: str, name: str, **labels: str) -> float:
    """One sample of the Prometheus text; 0.0 when the labelled series does not exist yet."""
    for family in text_string_to_metric_families(client_text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return 0.0


async def scrape(client: httpx.AsyncClient) -> str:
    response = await client.get("/metrics")
    assert response.status_code == 200
    return response.text


# ---------------------------------------------------------------------------- resolver double
# Whose pods a lookup handler finds: by the caller's username (self-service) or by each named
# principal (delegated). A protocol double of the filter-resolver; the real one has its own tests.
OWNED = {"name-of-user-1": ["pod-2"], "name-of-user-2": ["pod-1", "pod-3"], "dora-principal": ["pod-2"]}


@dataclass
class FakeResolver:
    mode: str = "cached"  # cached | one_shot | error | silent
    requests: list[bytes] = field(default_factory=list)
    claims: list[ClaimCheck] = field(default_factory=list)

    def reset(self) -> None:
        self.mode = "cached"
        self.requests.clear()
        self.claims.clear()


def _owned(claim: ClaimCheck) -> list[str]:
    if claim.principals is not None:  # delegated (RF-05): exactly the named principals' pods
        return sorted({pod for p in claim.principals for pod in OWNED.get(p, [])})
    username = claim.caller.username if claim.caller else None
    return OWNED.get(username or "", [])


@contextlib.asynccontextmanager
async def fake_resolver(world: World) -> AsyncIterator[FakeResolver]:
    """Consumes dataplane.plan.requests from its end and answers by the contract."""
    state = FakeResolver()
    redis = aioredis.from_url(world.redis_url)
    producer = AIOKafkaProducer(bootstrap_servers=world.kafka, enable_idempotence=False)
    consumer = AIOKafkaConsumer(bootstrap_servers=world.kafka, group_id=None, fetch_max_wait_ms=10)
    await producer.start()
    await consumer.start()
    tps = [TopicPartition(PLAN_REQUESTS, p) for p in sorted(await producer.partitions_for(PLAN_REQUESTS))]
    consumer.assign(tps)
    await consumer.seek_to_end(*tps)
    for tp in tps:
        await consumer.position(tp)

    async def answer(raw: bytes) -> None:
        state.requests.append(raw)
        req = PlanRequest.model_validate_json(raw)
        claim = ClaimCheck.model_validate_json(await redis.getdel(redis_claim_key(req.claim_check_id)))
        state.claims.append(claim)
        if state.mode == "silent":
            return
        plan = Plan.among(str(claim.args["column"]), _owned(claim), label="pod keys")
        reply: PlanResolved
        if state.mode == "error":
            reply = PlanResolved(
                correlation_id=req.correlation_id,
                cache_key=req.cache_key,
                outcome="error",
                error_code="row_filter_unavailable",
                error_detail="registry unreachable",
            )
        elif state.mode == "one_shot":
            once = uuid.uuid4().hex
            await redis.set(redis_one_shot_key(once), plan.model_dump_json(), ex=30)
            reply = PlanResolved(
                correlation_id=req.correlation_id,
                cache_key=req.cache_key,
                outcome="one_shot",
                one_shot_id=once,
            )
        else:
            await redis.set(redis_plan_key(req.cache_key), plan.model_dump_json(), ex=60)
            reply = PlanResolved(correlation_id=req.correlation_id, cache_key=req.cache_key, outcome="cached")
        await producer.send_and_wait(
            req.reply_topic, reply.model_dump_json().encode(), partition=req.reply_partition
        )

    async def loop() -> None:
        while True:
            batches = await consumer.getmany(timeout_ms=200)
            for records in batches.values():
                for record in records:
                    await answer(record.value)

    task = asyncio.create_task(loop())
    try:
        yield state
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await consumer.stop()
        await producer.stop()
        await redis.aclose()


async def flush_plan_cache(world: World) -> None:
    """Empties the shared Redis tier (the in-process tier belongs to each gateway)."""
    redis = aioredis.from_url(world.redis_url)
    for key in [k async for k in redis.scan_iter("dataplane:*")]:
        await redis.delete(key)
    await redis.aclose()
