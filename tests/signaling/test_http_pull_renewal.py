"""http-pull token renewal (issue 13): the refresh_token grant authenticated by the consumer's
did:web client JWT, rotation, retirement by suspend, and every refusal audited and changing nothing.

Signaling runs in-process with the did:web host double as a real HTTP server; the two "gateway
replicas" are two instances of the gateway's own PullVerifier, each with its own pool and memos,
reading signaling's database as the pull-grant role (SELECT on the view, EXECUTE on the first-use
function, nothing else)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from dataplane_local.doubles.did_web import DidIdentity, DidWebHost
from dataplane_service_kit.errors import ServiceError
from dataplane_testing.signaling import FLOWS, auth, new_id, run_app, sql, start_message
from query_gateway.clients.pull import PullVerifier, VerifiedPull
from signaling.tokens import public_key_pem

PROFILE = "https://w3id.org/dspace-sig/profile/http-pull"
PROVIDER = "did:web:provider.example"
TOKEN = "/dps/token"
TOKEN_COLUMNS = "token_id, refresh_hash, pending_token_id, pending_refresh_hash"


@pytest.fixture
def consumer(did_host: DidWebHost) -> DidIdentity:
    return did_host.identity("consumer")


@pytest.fixture
async def app(base_settings: dict[str, Any]) -> AsyncIterator[Any]:
    values = {
        **base_settings,
        "dps_transfer_types": ["HttpData-PULL", PROFILE],
        "dps_did_web_allow_http": True,
    }
    async with run_app(values) as running:
        yield running


def _db(app: Any) -> str:
    return str(app.settings.database_url.replace("+asyncpg", ""))


@pytest.fixture
async def replicas(
    app: Any, signing_key: ec.EllipticCurvePrivateKey, pull_grant_role: str
) -> AsyncIterator[list[PullVerifier]]:
    """Two gateway replicas' pull verifiers, reading as the pull-grant role."""
    pools = [
        await asyncpg.create_pool(
            _db(app),
            min_size=1,
            max_size=2,
            server_settings={"default_transaction_read_only": "on", "role": pull_grant_role},
        )
        for _ in range(2)
    ]
    yield [PullVerifier(public_key_pem(signing_key), pool) for pool in pools]
    for pool in pools:
        await pool.close()


class Flow:
    def __init__(self, app: Any, flow_id: str, body: dict[str, Any]) -> None:
        self.app, self.id = app, flow_id
        props = {p["name"]: p["value"] for p in body["dataAddress"]["endpointProperties"]}
        self.access, self.refresh = props["authorization"], props["refreshToken"]
        self.refresh_endpoint = props["refreshEndpoint"]


async def _start(app: Any, cp_token: Any, consumer: DidIdentity) -> Flow:
    flow_id = new_id()
    msg = start_message(flow_id, transferType=PROFILE, counterPartyId=consumer.did, participantId=PROVIDER)
    r = await app.client.post(f"{FLOWS}/start", json=msg, headers=auth(cp_token()))
    assert r.status_code == 200, r.text
    return Flow(app, flow_id, r.json())


async def _renew(
    app: Any, refresh: str, client_jwt: str | None, grant_type: str = "refresh_token"
) -> httpx.Response:
    headers = {} if client_jwt is None else {"Authorization": f"Bearer {client_jwt}"}
    return await app.client.post(
        TOKEN, data={"grant_type": grant_type, "refresh_token": refresh}, headers=headers
    )


async def _renewed(
    app: Any, consumer: DidIdentity, refresh: str, access: str, client_jwt: str | None = None
) -> tuple[str, str]:
    r = await _renew(app, refresh, client_jwt or consumer.client_jwt(aud=PROVIDER, token=access))
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"access_token", "token_type", "expires_in", "refresh_token"}
    assert body["token_type"] == "Bearer" and body["expires_in"] == app.settings.dps_token_ttl_seconds
    assert r.headers["cache-control"] == "no-store"
    return body["access_token"], body["refresh_token"]


async def _pulls(replica: PullVerifier, access: str) -> VerifiedPull:
    return await replica.verify(f"Bearer {access}", None)


async def _refused(replica: PullVerifier, access: str, code: str) -> None:
    with pytest.raises(ServiceError) as caught:
        await _pulls(replica, access)
    assert caught.value.code == code


def _code(r: httpx.Response, status: int, code: str) -> None:
    assert r.status_code == status, r.text
    assert r.json()["error"] == code


async def test_renewal_a_renewed_token_pulls_on_both_replicas_and_retires_the_old_pair_on_first_use(
    app: Any, cp_token: Any, consumer: DidIdentity, replicas: list[PullVerifier]
) -> None:
    a, b = replicas
    flow = await _start(app, cp_token, consumer)
    assert flow.refresh_endpoint == "https://signaling.example/dps/token"
    assert (await _pulls(a, flow.access)).consumer == consumer.did
    access, refresh = await _renewed(app, consumer, flow.refresh, flow.access)
    # the new pair is pending: the old access token still pulls until the new one is used
    await _pulls(b, flow.access)
    pulled = await _pulls(a, access)
    assert (pulled.consumer, pulled.flow_id, pulled.provider) == (consumer.did, flow.id, PROVIDER)
    await _pulls(b, access)
    for replica in replicas:
        await _refused(replica, flow.access, "pull_token")
    _code(
        await _renew(app, flow.refresh, consumer.client_jwt(aud=PROVIDER, token=flow.access)),
        400,
        "refresh_token_invalid",
    )
    # and the new refresh token renews in turn
    again, _ = await _renewed(app, consumer, refresh, access)
    await _pulls(b, again)
    await _refused(a, access, "pull_token")


async def test_renewal_with_the_new_refresh_token_retires_the_old_pair(
    app: Any, cp_token: Any, consumer: DidIdentity, replicas: list[PullVerifier]
) -> None:
    flow = await _start(app, cp_token, consumer)
    access, refresh = await _renewed(app, consumer, flow.refresh, flow.access)
    third, _ = await _renewed(app, consumer, refresh, access)
    await _refused(replicas[0], flow.access, "pull_token")
    await _pulls(replicas[0], access)  # the pair presented is the current one now
    await _pulls(replicas[1], third)
    await _refused(replicas[1], access, "pull_token")


async def test_renewal_retried_with_the_old_refresh_token_replaces_the_unused_pair(
    app: Any, cp_token: Any, consumer: DidIdentity, replicas: list[PullVerifier]
) -> None:
    flow = await _start(app, cp_token, consumer)
    lost, _ = await _renewed(app, consumer, flow.refresh, flow.access)  # its answer "lost"
    retried, _ = await _renewed(app, consumer, flow.refresh, flow.access)
    await _refused(replicas[0], lost, "pull_token")
    await _pulls(replicas[0], retried)
    await _refused(replicas[1], flow.access, "pull_token")


async def test_renewal_an_expired_access_token_is_refused_with_its_code_and_renews(
    base_settings: dict[str, Any],
    cp_token: Any,
    consumer: DidIdentity,
    signing_key: ec.EllipticCurvePrivateKey,
    pull_grant_role: str,
) -> None:
    values = {
        **base_settings,
        "dps_transfer_types": [PROFILE],
        "dps_did_web_allow_http": True,
        "dps_token_ttl_seconds": 1,
    }
    async with run_app(values) as app:
        pool = await asyncpg.create_pool(
            _db(app), min_size=1, max_size=1, server_settings={"role": pull_grant_role}
        )
        try:
            replica = PullVerifier(public_key_pem(signing_key), pool)
            flow = await _start(app, cp_token, consumer)
            exp = jwt.decode(flow.access, options={"verify_signature": False})["exp"]
            await _pulls(replica, flow.access)
            await asyncio.sleep(max(0.0, exp - time.time()) + 0.05)  # waits for the clock to pass exp
            await _refused(replica, flow.access, "pull_token_expired")
            # an expired access token may still be named in a renewal: the refresh token decides
            access, _ = await _renewed(app, consumer, flow.refresh, flow.access)
            await _pulls(replica, access)
        finally:
            await pool.close()


async def test_renewal_after_suspend_neither_token_works_and_resume_issues_a_working_pair(
    app: Any, cp_token: Any, consumer: DidIdentity, replicas: list[PullVerifier]
) -> None:
    flow = await _start(app, cp_token, consumer)
    pending, pending_refresh = await _renewed(app, consumer, flow.refresh, flow.access)
    r = await app.client.post(f"{FLOWS}/{flow.id}/suspend", json={}, headers=auth(cp_token()))
    assert r.status_code == 200
    for replica in replicas:
        for access in (flow.access, pending):
            await _refused(replica, access, "pull_token")
    for refresh, access in ((flow.refresh, flow.access), (pending_refresh, pending)):
        _code(
            await _renew(app, refresh, consumer.client_jwt(aud=PROVIDER, token=access)),
            400,
            "refresh_token_invalid",
        )
    r = await app.client.post(f"{FLOWS}/{flow.id}/resume", json={}, headers=auth(cp_token()))
    assert r.status_code == 200, r.text
    resumed = Flow(app, flow.id, r.json())
    for replica in replicas:
        await _pulls(replica, resumed.access)
    renewed, _ = await _renewed(app, consumer, resumed.refresh, resumed.access)
    await _pulls(replicas[1], renewed)
    await _refused(replicas[0], flow.access, "pull_token")


def _audit(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [r.msg for r in caplog.records if r.name == "dataplane.audit" and isinstance(r.msg, dict)]


async def _snapshot(app: Any, flow: Flow) -> tuple[Any, ...]:
    [row] = await sql(_db(app), f"SELECT {TOKEN_COLUMNS} FROM dps_data_flows WHERE id = $1", flow.id)
    jtis = await sql(_db(app), "SELECT issuer, jti FROM dps_client_jtis ORDER BY issuer, jti")
    return tuple(row.values()), [tuple(j.values()) for j in jtis]


async def test_renewal_refusals_are_coded_audited_and_change_nothing(
    app: Any,
    cp_token: Any,
    consumer: DidIdentity,
    did_host: DidWebHost,
    replicas: list[PullVerifier],
    caplog: pytest.LogCaptureFixture,
) -> None:
    flow = await _start(app, cp_token, consumer)
    used = consumer.client_jwt(aud=PROVIDER, token=flow.access)
    access, refresh = await _renewed(app, consumer, flow.refresh, flow.access, used)
    await _pulls(replicas[0], access)  # the current pair is (access, refresh) from here on
    other = did_host.identity("someone-else")
    forger = ec.generate_private_key(ec.SECP256R1())
    cases: list[tuple[str, str | None, int, str, str | None]] = [
        # (name, client JWT, status, code, the DID the audit record names)
        (
            "forged",
            consumer.client_jwt(aud=PROVIDER, token=access, key=forger),
            401,
            "client_jwt_invalid",
            None,
        ),
        (
            # refused before its DID is resolved: only the counter-party's document is fetched
            "not the counter-party",
            other.client_jwt(aud=PROVIDER, token=access),
            401,
            "client_not_counter_party",
            None,
        ),
        (
            "replayed jti",
            consumer.client_jwt(aud=PROVIDER, token=access, jti=_jti(used)),
            401,
            "client_jwt_replayed",
            consumer.did,
        ),
        (
            "wrong audience",
            consumer.client_jwt(aud="did:web:elsewhere.example", token=access),
            401,
            "client_audience",
            consumer.did,
        ),
        (
            "another token",
            consumer.client_jwt(aud=PROVIDER, token=flow.access),
            401,
            "client_jwt_invalid",
            consumer.did,
        ),
        (
            "sub is not iss",
            consumer.client_jwt(aud=PROVIDER, token=access, sub=other.did),
            401,
            "client_jwt_invalid",
            None,
        ),
        (
            "no exp",
            consumer.client_jwt(aud=PROVIDER, token=access, exp=None),
            401,
            "client_jwt_invalid",
            None,
        ),
        ("no client JWT", None, 401, "client_auth_required", None),
    ]
    before = await _snapshot(app, flow)
    for name, client_jwt, status, code, named in cases:
        caplog.clear()
        caplog.set_level(logging.INFO, logger="dataplane.audit")
        r = await _renew(app, refresh, client_jwt)
        assert (r.status_code, r.json()["error"]) == (status, code), name
        [record] = _audit(caplog)
        assert (record["action"], record["reason"], record["status"]) == (
            "dps.token_refresh",
            code,
            status,
        ), name
        assert record["client_id"] == named, name
        text = caplog.text + repr(record)
        assert refresh not in text and access not in text, name
        assert client_jwt is None or client_jwt not in text, name
        assert await _snapshot(app, flow) == before, name
    caplog.clear()
    never = await _renew(app, "never-issued", consumer.client_jwt(aud=PROVIDER, token=access))
    _code(never, 400, "refresh_token_invalid")
    wrong_grant = await _renew(app, refresh, consumer.client_jwt(aud=PROVIDER, token=access), "password")
    _code(wrong_grant, 400, "unsupported_grant_type")
    assert [r["reason"] for r in _audit(caplog)] == ["refresh_token_invalid", "unsupported_grant_type"]
    # nothing changed: the current pair still pulls and renews
    assert (await _snapshot(app, flow))[0] == before[0]
    await _pulls(replicas[1], access)
    await _renewed(app, consumer, refresh, access)


async def test_renewal_a_counter_party_whose_did_does_not_resolve_is_refused_audited_and_changes_nothing(
    app: Any, cp_token: Any, did_host: DidWebHost, caplog: pytest.LogCaptureFixture
) -> None:
    # a DID on the host that was never published: its document is 404
    unknown = DidIdentity(f"did:web:{did_host.host}:nobody", "key-1", ec.generate_private_key(ec.SECP256R1()))
    flow = await _start(app, cp_token, unknown)
    before = await _snapshot(app, flow)
    caplog.set_level(logging.INFO, logger="dataplane.audit")
    r = await _renew(app, flow.refresh, unknown.client_jwt(aud=PROVIDER, token=flow.access))
    _code(r, 401, "client_did_unresolvable")
    [record] = _audit(caplog)
    assert (record["action"], record["reason"], record["client_id"]) == (
        "dps.token_refresh",
        "client_did_unresolvable",
        None,
    )
    assert "/nobody/did.json" in did_host.requests
    assert await _snapshot(app, flow) == before


async def test_renewal_refuses_plain_http_did_web_unless_the_test_setting_allows_it(
    base_settings: dict[str, Any], cp_token: Any, consumer: DidIdentity
) -> None:
    async with run_app({**base_settings, "dps_transfer_types": [PROFILE]}) as app:
        flow = await _start(app, cp_token, consumer)
        r = await _renew(app, flow.refresh, consumer.client_jwt(aud=PROVIDER, token=flow.access))
        _code(r, 401, "client_did_unresolvable")


def _jti(client_jwt: str) -> str:
    return str(jwt.decode(client_jwt, options={"verify_signature": False})["jti"])
