"""Issue 31: the libraries whose lines carry URLs (httpx, httpcore) or connection chatter (the
Kafka clients) are quiet in every service, at DEBUG too: one place, `configure_logging`."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import httpx
import pytest
from fastapi import FastAPI

from dataplane_local.doubles.server import RunningServer, serve_in_thread
from dataplane_service_kit.logs import QUIET_LIBRARIES, configure_logging


@pytest.fixture
def list_endpoint() -> Iterator[RunningServer]:
    app = FastAPI()

    @app.get("/members")
    async def members() -> list[str]:
        return []

    server = serve_in_thread(app)
    yield server
    server.stop()


@pytest.fixture(params=["DEBUG", "INFO"])
def service_logging(request: pytest.FixtureRequest) -> None:
    """The services' JSON logging at LOG_LEVEL, set up before the test's own capture starts."""
    configure_logging("issue31", request.param)


async def test_issue31_an_outgoing_url_is_never_logged(
    service_logging: None, list_endpoint: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    # an http_in_list URL may carry a caller's values (RF-08)
    url = f"{list_endpoint.url}/members?subject=did:web:alice.example"
    async with httpx.AsyncClient() as http:
        assert (await http.get(url)).status_code == 200
    logging.getLogger("issue31").warning("after the request")  # the capture itself works
    assert "after the request" in caplog.text
    assert "alice.example" not in caplog.text
    for name in QUIET_LIBRARIES:
        assert not logging.getLogger(name).isEnabledFor(logging.INFO), name
    assert {"httpx", "httpcore", "aiokafka"} <= set(QUIET_LIBRARIES)


def test_issue31_a_stricter_level_than_warning_is_kept() -> None:
    configure_logging("issue31", "ERROR")
    assert not logging.getLogger("httpx").isEnabledFor(logging.WARNING)
    assert logging.getLogger("httpx").isEnabledFor(logging.ERROR)
