"""Support of the query-gateway tests: the test world (settings, tokens), the gateway driven
in-process, and a protocol double of the filter-resolver."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import asyncpg
import httpx
import jwt
import redis.asyncio as aioredis
from aiokafka import AIOKafkaProducer
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from pydantic import SecretStr

from dataplane_contracts.events import PlanRequest, PlanResolved
from dataplane_contracts.plans import ClaimCheck, Plan, redis_claim_key, redis_one_shot_key, redis_plan_key
from dataplane_contracts.topics import PLAN_REQUESTS
from dataplane_local.doubles.ds_connector import DsConnectorDouble
from dataplane_local.doubles.oidc import OidcIssuer
from query_gateway.app import create_app
from query_gateway.settings import Settings

from .topics import assigned, follow

CATALOGUE = Path(__file__).parents[1] / "query_gateway" / "catalogue.yaml"
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

    def settings(self, **overrides: Any) -> Settings:
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
        return Settings(**values)

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


async def grant(flows_url: str, state: str = "STARTED", **over: str) -> str:
    """A flow's pull grant (by default a STARTED flow of the agreement between PROVIDER and
    CONSUMER over `stats`; `over` replaces columns); its token id."""
    jti = str(uuid.uuid4())
    row = {
        "token_id": jti,
        "flow_id": f"flow-{jti[:8]}",
        "state": state,
        "agreement_id": AGREEMENT,
        "dataset_id": "stats",
        "participant_id": PROVIDER,
        "counter_party_id": CONSUMER,
    }
    row.update(over)
    conn = await asyncpg.connect(flows_url)
    await conn.execute("INSERT INTO dps_pull_grants VALUES ($1, $2, $3, $4, $5, $6, $7)", *row.values())
    await conn.close()
    return jti


async def started_grant(flows_url: str, dataset: str = "stats") -> str:
    """A STARTED flow's pull grant over `dataset`; its token id."""
    return await grant(flows_url, dataset_id=dataset)


def pull_token(jti: str, aud: str = CONSUMER, iss: str = PROVIDER, key: Any = KEY) -> str:
    claims = {"jti": jti, "iss": iss, "sub": iss, "aud": aud, "iat": int(time.time())}
    return jwt.encode(claims, key, algorithm="ES256")


# the pull-grant view in the shape signaling publishes it
PULL_GRANTS_DDL = (
    "CREATE TABLE dps_pull_grants (token_id text PRIMARY KEY, flow_id text, state text,"
    " agreement_id text, dataset_id text, participant_id text, counter_party_id text,"
    " grant_extensions text)"
)


async def edr_query(
    client: httpx.AsyncClient, world: World, sql: str, token: str | None = None, **headers: str
) -> httpx.Response:
    """`POST /query` on the EDR path, with an EDR of the agreement (or `token`)."""
    h = {
        "Authorization": f"Bearer {token or world.edr()}",
        "Edc-Contract-Agreement-Id": AGREEMENT,
        "Edc-Transfer-Process-Id": "tp-1",
        "Edc-Purpose": " analytics, ,billing ",
    }
    h.update(headers)
    return await client.post("/query", json={"sql": sql}, headers=h)


def authorize_answer(datasets: list[dict[str, Any]], decision: str = "allow") -> dict[str, Any]:
    """ds's answer to an authorize call, as a fault of the double returns it."""
    return {"decision": decision, "datasets": datasets, "decision_ref": "f" * 64}


def refused(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.json()["error"] == code


def _env_value(value: Any) -> str:
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple | list):
        return ",".join(str(v) for v in value)
    return str(value)


def process_env(settings: Settings, port: int) -> dict[str, str]:
    """The settings as a `query-gateway` process reads them: one variable per field that is set."""
    env = {k.upper(): _env_value(v) for k, v in settings.model_dump().items() if v is not None}
    return {**os.environ, **env, "HTTP_HOST": "127.0.0.1", "HTTP_PORT": str(port), "LOG_LEVEL": "INFO"}


@contextlib.asynccontextmanager
async def running_gateway(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            yield client


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


def extended_catalogue(directory: Path, extra: str = EXTRA_DATASETS, name: str = "extended") -> str:
    """The shared catalogue with the datasets `extra` lists appended, written in `directory`."""
    path = directory / f"catalogue-{name}.yaml"
    path.write_text(CATALOGUE.read_text().rstrip("\n") + "\n" + extra)
    return str(path)


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
    await producer.start()

    async def answer(raw: bytes) -> None:
        state.requests.append(raw)
        req = PlanRequest.model_validate_json(raw)
        claim = ClaimCheck.model_validate_json(
            cast(bytes, await redis.getdel(redis_claim_key(req.claim_check_id)))
        )
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

    try:
        async with assigned(world.kafka, [PLAN_REQUESTS], from_end=True) as (consumer, _):
            task = asyncio.create_task(follow(consumer, lambda record: answer(record.value)))
            try:
                yield state
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
    finally:
        await producer.stop()
        await redis.aclose()


async def flush_plan_cache(world: World) -> None:
    """Empties the shared Redis tier (the in-process tier belongs to each gateway)."""
    redis = aioredis.from_url(world.redis_url)
    for key in [k async for k in redis.scan_iter("dataplane:*")]:
        await redis.delete(key)
    await redis.aclose()
