"""Issue 31: the one client-credentials token source of the four services and `signaling
register` (dataplane_service_kit.oauth), against the OIDC issuer double over real HTTP."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator

import httpx
import jwt
import pytest

from dataplane_contracts.settings import OidcSettings
from dataplane_local.doubles.oidc import OidcIssuer, start_oidc_issuer
from dataplane_local.infra import free_port
from dataplane_service_kit.logs import configure_logging
from dataplane_service_kit.oauth import TokenUnavailable, fetch_token, service_token

SECRET = "s3cret-of-the-gateway"


@pytest.fixture
def issuer() -> Iterator[OidcIssuer]:
    issuer, server = start_oidc_issuer(clients={"gateway": SECRET})
    yield issuer
    server.stop()


@pytest.fixture
def service_logging() -> None:
    """The services' JSON logging at DEBUG, set up before the test's own log capture starts."""
    configure_logging("issue31", "DEBUG")


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as client:
        yield client


def _settings(base_url: str, client_id: str | None = "gateway", secret: str | None = SECRET) -> OidcSettings:
    return OidcSettings(
        celine_oidc_base_url=base_url, celine_oidc_client_id=client_id, celine_oidc_client_secret=secret
    )


async def test_issue31_the_token_is_fetched_once_and_kept_until_its_margin(
    issuer: OidcIssuer, http: httpx.AsyncClient
) -> None:
    tokens = service_token(http, _settings(issuer.base_url), timeout_s=2, scope="rec-registry.lookup")
    first = await tokens.get()
    assert first is not None and await tokens.get() == first
    assert issuer.token_requests == 1
    claims = jwt.decode(first, options={"verify_signature": False})
    assert claims["azp"] == "gateway" and claims["scope"] == "rec-registry.lookup"
    # an upstream refused it: the next caller fetches anew, and a stale refusal drops nothing
    tokens.invalidate(first)
    second = await tokens.get()
    assert issuer.token_requests == 2
    tokens.invalidate(first)
    assert await tokens.get() == second and issuer.token_requests == 2


async def test_issue31_a_token_within_its_margin_is_not_used_again(
    issuer: OidcIssuer, http: httpx.AsyncClient
) -> None:
    # a third of the lifetime (at most a minute) before expiry is already too late: a 3 s token
    # is refreshed after 2 s, a 0 s one every time
    issuer.token_lifetime = 0
    tokens = service_token(http, _settings(issuer.base_url), timeout_s=2)
    await tokens.get()
    await tokens.get()
    assert issuer.token_requests == 2


async def test_issue31_no_client_id_means_no_bearer_and_no_request(
    issuer: OidcIssuer, http: httpx.AsyncClient
) -> None:
    tokens = service_token(http, _settings(issuer.base_url, client_id=None, secret=None), timeout_s=2)
    assert not tokens.configured
    assert await tokens.get() is None
    assert issuer.token_requests == 0


async def test_issue31_a_client_id_without_its_secret_fails_closed_without_asking(
    issuer: OidcIssuer, http: httpx.AsyncClient
) -> None:
    tokens = service_token(http, _settings(issuer.base_url, secret=None), timeout_s=2)
    assert tokens.configured and not tokens.complete
    with pytest.raises(TokenUnavailable) as refused:
        await tokens.get()
    assert not refused.value.transient  # configuration: retrying cannot help
    assert "CELINE_OIDC_CLIENT_SECRET" in str(refused.value)
    assert issuer.token_requests == 0


async def test_issue31_a_refusing_issuer_is_final_an_unreachable_one_transient(
    issuer: OidcIssuer, http: httpx.AsyncClient
) -> None:
    wrong = service_token(http, _settings(issuer.base_url, secret="not-it"), timeout_s=2)
    with pytest.raises(TokenUnavailable) as refused:
        await wrong.get()
    assert refused.value.status == 401 and not refused.value.transient
    gone = service_token(http, _settings(f"http://127.0.0.1:{free_port()}"), timeout_s=2)
    with pytest.raises(TokenUnavailable) as unreachable:
        await gone.get()
    assert unreachable.value.status is None and unreachable.value.transient


async def test_issue31_neither_token_nor_secret_reaches_a_log_line_or_a_repr(
    issuer: OidcIssuer, http: httpx.AsyncClient, service_logging: None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    tokens = service_token(http, _settings(issuer.base_url), timeout_s=2)
    token = await tokens.get()
    assert token is not None
    with pytest.raises(TokenUnavailable) as refused:
        await service_token(http, _settings(issuer.base_url, secret="wrong-" + SECRET), timeout_s=2).get()
    assert any("service_token_fetched" in r.getMessage() for r in caplog.records)
    seen = caplog.text + repr(tokens) + str(refused.value)
    assert token not in seen and SECRET not in seen


def test_issue31_signaling_register_asks_the_same_way(issuer: OidcIssuer) -> None:
    token_url = _settings(issuer.base_url).oidc_token_url()
    assert token_url is not None
    with httpx.Client() as http:
        token = fetch_token(http, token_url, "gateway", SECRET)
        assert jwt.decode(token, options={"verify_signature": False})["azp"] == "gateway"
        with pytest.raises(TokenUnavailable) as refused:
            fetch_token(http, token_url, "gateway", "not-it")
    assert refused.value.status == 401
    assert issuer.token_requests == 2
