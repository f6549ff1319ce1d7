"""One delivery attempt against a real HTTP server: which answers are retried, which are final."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from fastapi import FastAPI, Response

from audit_relay.delivery import Accepted, ConnectorPools, DsSender, Refused, Retry
from audit_relay.health import Health
from dataplane_local.doubles.server import RunningServer, serve_in_thread
from dataplane_local.infra import free_port
from dataplane_service_kit.oauth import ClientCredentialsToken as ServiceToken


@pytest.fixture(scope="module")
def status_server() -> Iterator[RunningServer]:
    app = FastAPI()

    @app.post("/{code}/internal/audit/query")
    async def answer(code: int) -> Response:
        headers = {"Retry-After": "3"} if code in (429, 503) else {}
        return Response(status_code=code, headers=headers)

    server = serve_in_thread(app)
    yield server
    server.stop()


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=2.0) as c:
        yield c


@pytest.fixture
async def pools() -> AsyncIterator[ConnectorPools]:
    pools = ConnectorPools(max_in_flight=4, timeout_s=2.0)
    yield pools
    await pools.aclose()


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (200, Accepted(200)),
        (202, Accepted(202)),
        (400, Refused(400)),
        (404, Refused(404)),
        (409, Refused(409)),
        (422, Refused(422)),
        (408, Retry("http_408")),
        (429, Retry("http_429", 3.0)),
        (500, Retry("http_500")),
        (503, Retry("http_503", 3.0)),
        (401, Retry("http_401")),
        (403, Retry("http_403")),
        (307, Retry("http_307")),
    ],
)
async def test_answers_are_sorted_into_accepted_retry_and_final(
    status_server: RunningServer,
    client: httpx.AsyncClient,
    pools: ConnectorPools,
    code: int,
    expected: object,
) -> None:
    health = Health(grace_s=0)
    sender = DsSender(pools, _unconfigured(client), health)
    assert await sender.post(f"{status_server.url}/{code}", "e-1", b'{"row_count":1}') == expected
    assert health.ds_auth_ready() == (code not in (401, 403))


async def test_unreachable_ds_is_retried_and_unready_after_the_grace(
    client: httpx.AsyncClient, pools: ConnectorPools
) -> None:
    health = Health(grace_s=0)
    sender = DsSender(pools, _unconfigured(client), health)
    outcome = await sender.post(f"http://127.0.0.1:{free_port()}", "e-1", b"{}")
    assert outcome == Retry("connect_error")
    assert not health.ds_ready()


async def test_unreachable_issuer_is_retried_and_unready(
    client: httpx.AsyncClient, pools: ConnectorPools
) -> None:
    health = Health(grace_s=60)
    token = ServiceToken(
        client, token_url=f"http://127.0.0.1:{free_port()}/token", client_id="svc", client_secret="secret"
    )
    sender = DsSender(pools, token, health)
    assert await sender.post("http://127.0.0.1:9", "e-1", b"{}") == Retry("token")
    assert not health.ds_auth_ready()


def _unconfigured(client: httpx.AsyncClient) -> ServiceToken:
    return ServiceToken(client, token_url=None, client_id=None, client_secret=None)
