"""Support of the signaling tests (and of the gateway's records tests, which run signaling too):
names of the test clients, message builders, the flow-events reader, the migrate runner, and
`launch` for running `signaling` as a real server process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from aiokafka import ConsumerRecord
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from dataplane_contracts.dps import DEFAULT_PULL_GRANT_ROLE
from dataplane_contracts.topics import FLOW_EVENTS
from dataplane_local.timeouts import scaled
from signaling.app import create_app
from signaling.metrics import Metrics
from signaling.settings import Settings
from signaling.state import AppState

from .databases import admin
from .processes import ServiceProcess
from .topics import assigned, follow

AUDIENCE = "svc-signaling"
CP = "edc-control-plane"  # admitted
OTHER_CP = "other-control-plane"  # admitted, a different caller
STRANGER = "not-admitted"
SERVICE_CLIENT, SERVICE_SECRET = "dataplane-signaling", "signaling-secret"
FLOWS = "/dps/v1/dataflows"


def pem_of(key: ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()).decode()


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def new_id() -> str:
    return f"flow-{uuid.uuid4().hex[:12]}"


def start_message(flow_id: str, **overrides: Any) -> dict[str, Any]:
    """An EDC 0.18 (RC2-named) DataFlowStartMessage; an override of `...` removes the field."""
    msg: dict[str, Any] = {
        "messageId": str(uuid.uuid4()),
        "participantId": "did:web:provider.example",
        "counterPartyId": "did:web:consumer.example",
        "dataspaceContext": "ctx",
        "processId": flow_id,
        "agreementId": "agreement-1",
        "datasetId": "dataset-1",
        "transferType": "HttpData-PULL",
        "claims": {},
        "callbackAddress": None,
    }
    msg.update(overrides)
    return {k: v for k, v in msg.items() if v is not ...}


def consumer_address(token: str = "provider-secret-token") -> dict[str, Any]:
    """A provider's pull address as a consumer receives it (with its credential)."""
    return {
        "@type": "DataAddress",
        "endpointType": "https://w3id.org/idsa/v4.1/HTTP",
        "endpoint": "https://provider.example/dps/public",
        "endpointProperties": [
            {
                "@type": "EndpointProperty",
                "name": "https://w3id.org/edc/v0.0.1/ns/authorization",
                "value": token,
            },
            {
                "@type": "EndpointProperty",
                "name": "https://w3id.org/edc/v0.0.1/ns/authType",
                "value": "bearer",
            },
        ],
    }


def token_of(status_body: dict[str, Any]) -> str:
    for p in status_body["dataAddress"]["endpointProperties"]:
        if p["name"].endswith("authorization"):
            return str(p["value"])
    raise AssertionError("no authorization property")


def settings_values(db_url: str, bootstrap: str, oidc_url: str, signing_pem: str | None) -> dict[str, Any]:
    return {
        "database_url": db_url,
        "kafka_bootstrap_servers": bootstrap,
        "kafka_enable_idempotence": False,
        "outbox_poll_interval_ms": 100,
        "dps_enabled": True,
        "dps_signaling_url": "https://signaling.example",
        "dps_public_url": "https://gateway.example",
        "dps_control_plane_clients": [CP, OTHER_CP],
        "dps_token_signing_key": signing_pem,
        "celine_oidc_base_url": oidc_url,
        "celine_oidc_audience": AUDIENCE,
        "celine_oidc_client_id": SERVICE_CLIENT,
        "celine_oidc_client_secret": SERVICE_SECRET,
        "celine_oidc_jwks_min_refetch_seconds": 0,
    }


@dataclass
class Running:
    client: httpx.AsyncClient
    settings: Settings
    metrics: Metrics  # the app's own: what its /metrics serves


@asynccontextmanager
async def run_app(values: dict[str, Any]) -> AsyncIterator[Running]:
    """The app in-process through ASGI, its lifespan run (as the server would)."""
    settings = Settings(**values)
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        state: AppState = app.state.signaling
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://signaling") as client:
            yield Running(client, settings, state.metrics)


async def ensure_pull_grant_role(server_url: str) -> str:
    """The role the pull-grant view is granted to, created once per server (roles are
    cluster-wide), idempotently as the operator would; its name."""
    await admin(
        server_url,
        f"""DO $$ BEGIN
              IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{DEFAULT_PULL_GRANT_ROLE}') THEN
                CREATE ROLE {DEFAULT_PULL_GRANT_ROLE} NOLOGIN;
              END IF;
            EXCEPTION WHEN duplicate_object THEN NULL; END $$""",
    )
    return DEFAULT_PULL_GRANT_ROLE


async def sql(url: str, query: str, *args: Any) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(url)
    try:
        return list(await conn.fetch(query, *args))
    finally:
        await conn.close()


async def live_grants(url: str) -> dict[str, dict[str, Any]]:
    rows = await sql(url, "SELECT * FROM dps_pull_grants")
    return {r["token_id"]: dict(r) for r in rows}


def run_migrate(database_url: str, *args: str, role: str | None = None) -> subprocess.CompletedProcess[str]:
    """`signaling-migrate` exactly as an operator runs it, in its own process."""
    env = {**os.environ, "DATABASE_URL": database_url}
    if role is not None:
        env["DPS_PULL_GRANT_ROLE"] = role
    return subprocess.run(
        [sys.executable, "-m", "signaling.migrate", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=scaled(120),
        check=False,
    )


async def read_flow_events(
    bootstrap: str, until: Callable[[list[dict[str, Any]]], bool], timeout: float = 20.0
) -> list[dict[str, Any]]:
    """Records of the flow-events topic from the beginning, read until `until(records)` holds or
    the timeout passes. Each: partition, key, value (parsed), headers."""
    records: list[dict[str, Any]] = []

    def take(m: ConsumerRecord) -> None:
        records.append(
            {
                "partition": m.partition,
                "key": m.key.decode() if m.key else None,
                "value": json.loads(m.value),
                "headers": dict(m.headers or []),
            }
        )

    async with assigned(bootstrap, [FLOW_EVENTS]) as (consumer, _):
        await follow(consumer, take, stop=lambda: until(records), timeout=timeout)
    return records


def events_for(records: list[dict[str, Any]], flow_id: str) -> list[dict[str, Any]]:
    return [r["value"] for r in records if r["key"] == flow_id]


# ----------------------------------------------------------------------------- real processes


def process_env(values: dict[str, Any], port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DPS_", "CELINE_", "KAFKA_", "OUTBOX_"))}
    for k, v in values.items():
        if v is None:
            continue
        if isinstance(v, list):
            env[k.upper()] = json.dumps(v)
        elif isinstance(v, bool):
            env[k.upper()] = "true" if v else "false"
        else:
            env[k.upper()] = str(v)
    env.update({"HTTP_HOST": "127.0.0.1", "HTTP_PORT": str(port), "LOG_LEVEL": "INFO"})
    return env


def launch(values: dict[str, Any], port: int, log_path: Path) -> ServiceProcess:
    """`python -m signaling` with these settings, on `port`."""
    argv = [sys.executable, "-m", "signaling"]
    return ServiceProcess(argv, process_env(values, port), log_path, "signaling").start(port)
