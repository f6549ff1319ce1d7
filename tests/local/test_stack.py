"""`dataplane-local up --infra-only` starts real servers and doubles; `down` leaves no process;
a second `up` works; any server can be replaced by an existing one through its variable."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import jwt
import pytest
import redis.asyncio as aioredis

from dataplane_contracts.topics import topic_specs
from dataplane_local import provision
from dataplane_local.procs import process_tree, survivors


def cli(root: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dataplane_local.cli", "--dir", str(root), *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, **(env or {})},
    )


def read_env(root: Path) -> dict[str, str]:
    data: dict[str, Any] = json.loads((root / "stack.json").read_text())
    return {**data["env"], **data["tools"]}


def recorded(root: Path) -> list[dict[str, Any]]:
    procs: list[dict[str, Any]] = json.loads((root / "pids.json").read_text())["processes"]
    return procs


async def check_infra(env: dict[str, str]) -> None:
    conn = await asyncpg.connect(env["DATASETS_DATABASE_URL"])
    try:
        assert await conn.fetchval("SELECT count(DISTINCT pod) FROM meter_readings") == 4
        plan = await conn.fetchval("EXPLAIN SELECT * FROM meter_readings WHERE pod = 'IT001E00000001'")
        assert plan is not None
        indexes = await conn.fetch("SELECT indexdef FROM pg_indexes WHERE tablename = 'meter_readings'")
        assert any("(pod)" in r["indexdef"] for r in indexes)
        with pytest.raises(asyncpg.ReadOnlySQLTransactionError):
            await conn.execute("DELETE FROM meter_readings")
    finally:
        await conn.close()
    flows = await asyncpg.connect(env["DPS_FLOWS_DATABASE_URL"])
    assert await flows.fetchval("SELECT current_user") == provision.PULL_READER
    await flows.close()
    client = aioredis.from_url(env["REDIS_URL"])
    config = await client.config_get("maxmemory-policy")
    await client.aclose()
    assert config["maxmemory-policy"] == "volatile-lru"
    partitions = await provision.topic_partitions(env["KAFKA_BOOTSTRAP_SERVERS"])
    assert {s.name: s.partitions for s in topic_specs()}.items() <= partitions.items()


def check_doubles(env: dict[str, str]) -> None:
    ds = env["CONNECTOR_INTERNAL_URL"]
    body = {
        "consumer_did": "did:web:consumer.example",
        "agreement_id": "agr-demo",
        "transfer_id": None,
        "purpose": [],
        "dataset_ids": ["meter_readings"],
    }
    # the ds double asks for a service token from the OIDC double, like the real connector
    assert httpx.post(f"{ds}/internal/dataplane/authorize", json=body).status_code == 401
    token = httpx.post(
        f"{env['CELINE_OIDC_BASE_URL']}/protocol/openid-connect/token",
        data={
            "grant_type": "client_credentials",
            "client_id": env["CELINE_OIDC_CLIENT_ID"],
            "client_secret": env["CELINE_OIDC_CLIENT_SECRET"],
        },
    ).json()["access_token"]
    decision = httpx.post(
        f"{ds}/internal/dataplane/authorize", json=body, headers={"Authorization": f"Bearer {token}"}
    ).json()
    assert decision["decision"] == "allow"
    row_filter = decision["datasets"][0]["row_filter"]
    assert row_filter["handler"] == "subject_key_match"
    assert row_filter["args"] == {"column": "pod", "key_type": "pod"}
    assert row_filter["keys"] == ["pod:IT001E00000001", "pod:IT001E00000002"]
    assert row_filter["subject_dids"] == ["did:web:alice.example", "did:web:bob.example"]
    # the REC registry double verifies a person's token against the OIDC double
    user = httpx.post(
        f"{env['DATAPLANE_OIDC_URL']}/_mint",
        json={"claims": {"sub": "u-alice", "preferred_username": "alice"}},
    ).json()["token"]
    assert jwt.decode(user, options={"verify_signature": False})["iss"] == env["CELINE_OIDC_BASE_URL"]
    assets = httpx.get(f"{env['REC_REGISTRY_URL']}/user/assets", headers={"Authorization": f"Bearer {user}"})
    assert [a["sensor_id"] for a in assets.json()["items"]] == ["IT001E00000001", "IT001E00000003", None]


def check_otlp_receiver(root: Path, env: dict[str, str]) -> None:
    """The services export their spans to the stack's own OTLP receiver, which keeps them in the
    state directory for `dataplane-local traces`."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from dataplane_local.stack import TRACES_FILE
    from dataplane_local.traces import load_spans

    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == env["DATAPLANE_OTLP_URL"]
    request = ExportTraceServiceRequest()
    spans = request.resource_spans.add().scope_spans.add().spans
    spans.add(trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name="probe", kind=2)
    answer = httpx.post(
        f"{env['OTEL_EXPORTER_OTLP_ENDPOINT']}/v1/traces",
        content=request.SerializeToString(),
        headers={"content-type": "application/x-protobuf"},
    )
    assert answer.status_code == 200, answer.text
    assert [s.name for s in load_spans(root / TRACES_FILE)] == ["probe"]


def up_and_check(root: Path, env: dict[str, str] | None = None) -> dict[int, str | None]:
    result = cli(root, "up", "--infra-only", env=env)
    try:
        assert result.returncode == 0, result.stdout + result.stderr
        return _checked_up(root)
    except BaseException:
        cli(root, "down")  # a failed check leaves nothing running (issue 18)
        raise


def _checked_up(root: Path) -> dict[int, str | None]:
    stack_env = read_env(root)
    assert stack_env["KAFKA_ENABLE_IDEMPOTENCE"] == "false"
    # issue 12: fetch waits chosen per consumer for Tansu (short for request/reply, long otherwise)
    waits = (stack_env["KAFKA_RPC_FETCH_MAX_WAIT_MS"], stack_env["KAFKA_BULK_FETCH_MAX_WAIT_MS"])
    assert waits == ("2", "500")
    assert stack_env["RESOLVER_IDLE_FETCH_MAX_WAIT_MS"] == "250"
    assert (root / "stack.env").read_text().count("DPS_TOKEN_SIGNING_KEY='-----BEGIN PRIVATE KEY") == 1
    asyncio.run(check_infra(stack_env))
    check_doubles(stack_env)
    check_otlp_receiver(root, stack_env)
    status = cli(root, "status")
    assert status.returncode == 0, status.stdout
    return process_tree([p["pid"] for p in recorded(root)])


def down_and_check(root: Path, running: dict[int, str | None]) -> None:
    assert running
    result = cli(root, "down")
    assert result.returncode == 0, result.stdout + result.stderr
    assert not survivors(running)
    assert not (root / "pids.json").exists()


def test_up_infra_only_then_down_leaves_no_process_and_second_up_works(tmp_path: Path) -> None:
    root = tmp_path / "stack"
    first = up_and_check(root)
    try:
        names = [p["name"] for p in recorded(root)]
        assert names == ["kafka", "postgres", "redis", "oidc", "ds-connector", "rec-registry", "otlp"]
        again = cli(root, "up", "--infra-only")
        assert again.returncode == 1 and "already running" in again.stdout
    finally:
        down_and_check(root, first)
    second = up_and_check(root)  # the kept PostgreSQL data directory is provisioned again
    assert not first.keys() & second.keys()
    down_and_check(root, second)


def test_status_names_a_dead_broker_and_says_restart(
    tmp_path: Path, postgres_url: str, redis_server_url: str
) -> None:
    root = tmp_path / "stack"
    result = cli(
        root,
        "up",
        "--infra-only",
        env={"DATAPLANE_DATABASE_URL": postgres_url, "DATAPLANE_REDIS_URL": redis_server_url},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    procs = recorded(root)
    try:
        assert [p["name"] for p in procs] == ["kafka", "oidc", "ds-connector", "rec-registry", "otlp"]
        kafka = next(p for p in procs if p["name"] == "kafka")
        os.kill(kafka["pid"], 9)
        status = cli(root, "status")
        assert status.returncode == 1
        assert (
            "broker is down" in status.stdout
            and "dataplane-local down && dataplane-local up" in status.stdout
        )
    finally:
        running = process_tree([p["pid"] for p in procs])
        assert cli(root, "down").returncode == 0
        assert not survivors(running)


def test_existing_servers_replace_embedded_ones(
    tmp_path: Path, postgres_url: str, redis_server_url: str, kafka_bootstrap: str
) -> None:
    root = tmp_path / "stack"
    env = {
        "DATAPLANE_DATABASE_URL": postgres_url,
        "DATAPLANE_REDIS_URL": redis_server_url,
        "DATAPLANE_KAFKA_BOOTSTRAP": kafka_bootstrap,
    }
    running = up_and_check(root, env)
    assert [p["name"] for p in recorded(root)] == ["oidc", "ds-connector", "rec-registry", "otlp"]
    stack_env = read_env(root)
    assert stack_env["KAFKA_BOOTSTRAP_SERVERS"] == kafka_bootstrap
    assert stack_env["REDIS_URL"] == redis_server_url
    down_and_check(root, running)


def test_missing_service_is_named_with_its_reason() -> None:
    from dataplane_local.stack import missing_services

    found = missing_services(["query-gateway", "dataplane-local", "no-such-service"])
    assert found == {"no-such-service": "console script not installed"}


def _urls(root: Path) -> dict[str, str]:
    return {p["name"]: p["url"] for p in recorded(root)}


def test_restart_brings_one_process_back_on_its_port_and_ports_hold_across_ups(tmp_path: Path) -> None:
    """`dataplane-local restart NAME` replaces one process of the running stack (same command,
    port and settings) and leaves the others alone; a second `up` from the same state directory
    takes the ports the first recorded (ports.json), with `DATAPLANE_LOCAL_PORTS=any` too."""
    root = tmp_path / "stack"
    first = up_and_check(root)
    try:
        before = {p["name"]: p["pid"] for p in recorded(root)}
        urls = _urls(root)
        result = cli(root, "restart", "ds-connector")
        assert result.returncode == 0, result.stdout + result.stderr
        after = {p["name"]: p["pid"] for p in recorded(root)}
        assert after["ds-connector"] != before["ds-connector"]
        assert {k: v for k, v in after.items() if k != "ds-connector"} == {
            k: v for k, v in before.items() if k != "ds-connector"
        }
        assert _urls(root) == urls
        assert before["ds-connector"] not in survivors(first)  # the old process is gone
        check_doubles(read_env(root))  # the new one answers where the old one did
        unknown = cli(root, "restart", "no-such-service")
        assert unknown.returncode == 2 and "ds-connector" in unknown.stdout
        running = process_tree([p["pid"] for p in recorded(root)])
    except BaseException:
        cli(root, "down")
        raise
    down_and_check(root, {**first, **running})
    ports = json.loads((root / "ports.json").read_text())
    assert {"oidc", "ds-connector", "rec-registry"} <= ports.keys()
    second = up_and_check(root)
    try:
        doubles = {k: v for k, v in _urls(root).items() if k in ("oidc", "ds-connector", "rec-registry")}
        assert doubles == {k: v for k, v in urls.items() if k in doubles}
    finally:
        down_and_check(root, second)
