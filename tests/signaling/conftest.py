"""Fixtures for signaling: a migrated flows database per test (copied from a template migrated
once by the real `signaling-migrate`), the pull-grant role, the contracts topics, an OIDC issuer
double, a control-plane double, the app driven in-process, and real `signaling` processes."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from dataplane_contracts.topics import topic_specs
from dataplane_local.doubles.control_plane import ControlPlaneDouble, start_control_plane
from dataplane_local.doubles.oidc import OidcIssuer, start_oidc_issuer
from dataplane_local.infra import free_port
from dataplane_service_kit.logs import configure_logging
from dataplane_service_kit.topics_cli import create_topics
from dataplane_testing import signaling as support
from dataplane_testing.databases import create_database, drop_database


@pytest.fixture(scope="session", autouse=True)
def _json_logging() -> None:
    configure_logging("signaling-tests", "INFO")


@pytest.fixture(scope="session")
def signing_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


@pytest.fixture(scope="session")
def signing_pem(signing_key: ec.EllipticCurvePrivateKey) -> str:
    return str(support.pem_of(signing_key))


@pytest.fixture(scope="session")
async def pull_grant_role(postgres_url: str) -> str:
    """Roles are cluster-wide: created once per server, idempotently (as the operator would)."""
    return await support.ensure_pull_grant_role(postgres_url)


@pytest.fixture(scope="session")
async def signaling_template(postgres_url: str, pull_grant_role: str) -> str:
    url = await create_database(postgres_url, "signaling_tmpl_")
    done = await asyncio.to_thread(support.run_migrate, url, "upgrade", "head")
    assert done.returncode == 0, done.stderr
    return url.rpartition("/")[2]


@pytest.fixture
async def new_flows_db(
    postgres_url: str, signaling_template: str
) -> AsyncIterator[Callable[[], Awaitable[str]]]:
    """Make migrated, empty flows databases (postgresql://… URLs); dropped at teardown."""
    made: list[str] = []

    async def make() -> str:
        url = await create_database(postgres_url, "t_sig_", template=signaling_template)
        made.append(url)
        return url

    yield make
    for url in made:
        await drop_database(postgres_url, url)


@pytest.fixture
async def flows_db(new_flows_db: Callable[[], Awaitable[str]]) -> str:
    return await new_flows_db()


@pytest.fixture(scope="session")
async def topics(kafka_bootstrap: str) -> str:
    """Create every contracts topic as `dataplane-topics create` does (idempotent); the broker
    must not auto-create them."""
    await create_topics(kafka_bootstrap, topic_specs())
    return kafka_bootstrap


@pytest.fixture(scope="session")
def oidc() -> Iterator[OidcIssuer]:
    issuer, server = start_oidc_issuer(
        clients={support.SERVICE_CLIENT: support.SERVICE_SECRET}, default_audience=support.AUDIENCE
    )
    yield issuer
    server.stop()


@pytest.fixture
def control_plane() -> Iterator[tuple[ControlPlaneDouble, str]]:
    cp, server = start_control_plane()
    yield cp, server.url
    server.stop()


@pytest.fixture
def cp_token(oidc: OidcIssuer) -> Callable[..., str]:
    """A control plane's client-credentials token (azp = client) for the signalling audience."""

    def make(client: str = support.CP, **claims: Any) -> str:
        return oidc.mint({"azp": client, "gty": "client-credentials", **claims}, audience=support.AUDIENCE)

    return make


@pytest.fixture
def base_settings(flows_db: str, topics: str, oidc: OidcIssuer, signing_pem: str) -> dict[str, Any]:
    values: dict[str, Any] = support.settings_values(flows_db, topics, oidc.base_url, signing_pem)
    return values


@pytest.fixture
async def signaling(base_settings: dict[str, Any]) -> AsyncIterator[Any]:
    """The app with DPS enabled, in-process through ASGI, lifespan run."""
    async with support.run_app(base_settings) as running:
        yield running


@pytest.fixture
def spawn_signaling() -> Iterator[Callable[..., Awaitable[Any]]]:
    """Start `python -m signaling` with settings as env vars (waiting for /readyz unless
    wait=False); every process still running is terminated at teardown."""
    procs: list[Any] = []
    logdir = Path(tempfile.mkdtemp(prefix="signaling-proc-"))

    async def spawn(values: dict[str, Any], wait: bool = True) -> Any:
        port = free_port()
        p = support.launch(values, port, logdir / f"signaling-{port}.log")
        procs.append(p)
        if wait:
            await p.wait_ready()
        return p

    yield spawn
    for p in procs:
        p.stop()
