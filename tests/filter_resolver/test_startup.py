"""Start-up and readiness: a misconfigured resolver refuses to start naming the variable; a
running one is ready only with Kafka partitions held and Redis answering."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from dataplane_local.doubles.server import serve_in_thread
from dataplane_local.infra import free_port
from dataplane_testing.polling import eventually
from dataplane_testing.resolver import SECRET, make_settings
from filter_resolver.app import create_app

SCRIPT = Path(sys.executable).with_name("filter-resolver")
BASE_ENV = {
    "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1",
    "REDIS_URL": "redis://127.0.0.1:1/0",
    "ROW_FILTERS_CACHE_KEY_SECRET": SECRET,
    "HTTP_HOST": "127.0.0.1",
}


def _run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k not in BASE_ENV and not k.startswith("ROW_FILTERS")}
    full.update(env, HTTP_PORT=str(free_port()))
    return subprocess.run([str(SCRIPT)], env=full, capture_output=True, text=True, timeout=60, check=False)


def test_missing_secret_refuses_to_start() -> None:
    env = {k: v for k, v in BASE_ENV.items() if k != "ROW_FILTERS_CACHE_KEY_SECRET"}
    result = _run(env)
    assert result.returncode == 2
    assert "ROW_FILTERS_CACHE_KEY_SECRET" in result.stderr


def test_bad_retry_setting_refuses_to_start() -> None:
    result = _run({**BASE_ENV, "RESOLVER_RETRY_ATTEMPTS": "0"})
    assert result.returncode == 2
    assert "RESOLVER_RETRY_ATTEMPTS" in result.stderr


def test_unimportable_plugin_module_refuses_to_start() -> None:
    result = _run({**BASE_ENV, "ROW_FILTERS_MODULES": "rf_no_such_module_here"})
    assert result.returncode == 2
    assert "rf_no_such_module_here" in result.stderr


def test_gs08_a_declared_plugin_handler_no_plugin_provides_refuses_to_start() -> None:
    result = _run({**BASE_ENV, "ROW_FILTERS_PLUGIN_HANDLERS": "subject_key_mach"})
    assert result.returncode == 2
    assert "ROW_FILTERS_PLUGIN_HANDLERS" in result.stderr and "subject_key_mach" in result.stderr


async def _readyz(url: str) -> Any:
    async with httpx.AsyncClient() as client:
        return (await client.get(url + "/readyz")).json()


async def test_not_ready_without_partitions(redis_url: str) -> None:
    # Redis answers, the broker does not: unready, naming kafka only
    app = create_app(make_settings(redis_url=redis_url, kafka_bootstrap_servers=f"127.0.0.1:{free_port()}"))
    server = serve_in_thread(app)
    try:
        body = await _readyz(server.url)
        assert body == {"status": "unready", "error": "not_ready", "failing": ["kafka"]}
    finally:
        server.stop()


async def test_not_ready_without_redis(kafka_bootstrap: str) -> None:
    app = create_app(
        make_settings(
            redis_url=f"redis://127.0.0.1:{free_port()}/0",
            kafka_bootstrap_servers=kafka_bootstrap,
            plan_requests_topic=f"test.unready.{free_port()}",
            resolver_group_id=f"test-unready-{free_port()}",
        )
    )
    server = serve_in_thread(app)
    try:

        async def redis_named() -> bool:
            return "redis" in (await _readyz(server.url)).get("failing", [])

        assert await eventually(redis_named)
    finally:
        server.stop()
