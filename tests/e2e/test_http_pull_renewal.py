"""The http-pull profile across processes (issue 13): a real signaling process issues and renews
tokens, both real gateway replicas serve and refuse them, the consumer's did:web host is a double."""

from __future__ import annotations

import asyncio
import copy
import time
import uuid
from typing import Any

import httpx
import jwt
import pytest

from dataplane_local.demo import (
    DEMO_AGREEMENT,
    DEMO_DATASET,
    DEMO_PROVIDER,
    Wire,
    consenting,
    control_plane_token,
    pull,
    rows_pods,
    signal,
)
from dataplane_local.doubles.did_web import DidIdentity, DidWebHost
from dataplane_testing.e2e import System

pytestmark = pytest.mark.e2e

PROFILE = "https://w3id.org/dspace-sig/profile/http-pull"


class Pair:
    def __init__(self, access: str, refresh: str) -> None:
        self.access, self.refresh = access, refresh


def _audited(system: System, code: str) -> int:
    """Renewal refusals with this code audited by the signaling replica serving renewals."""
    return system.audited("signaling", "dps.token_refresh", code)


async def _start(
    system: System, wire: Wire, cp: str, consumer: DidIdentity, signaling: str | None = None
) -> tuple[str, Pair, str]:
    """A flow for `consumer` under a new agreement over the demo dataset, started on `signaling`
    (default: the first replica); (flow, pair, refreshEndpoint)."""
    agreement = f"agr-{uuid.uuid4().hex[:10]}"
    entries = copy.deepcopy(system.policy["agreements"][DEMO_AGREEMENT]["datasets"])
    system.policy["agreements"][agreement] = {"consumer": consumer.did, "datasets": entries}
    await system.ds_control({"action": "policy", "policy": system.policy})
    flow = f"flow-{uuid.uuid4().hex[:12]}"
    message = {
        "messageId": str(uuid.uuid4()),
        "processId": flow,
        "participantId": DEMO_PROVIDER,
        "counterPartyId": consumer.did,
        "agreementId": agreement,
        "datasetId": DEMO_DATASET,
        "profile": "http-pull",
    }
    r = await wire.call(
        "POST",
        f"{signaling or system.info.signaling_url}/dps/v1/dataflows/start",
        json_body=message,
        headers={"Authorization": f"Bearer {cp}"},
    )
    assert r.status_code == 200, r.text
    address = r.json()["dataAddress"]
    assert address["endpointType"] == PROFILE
    props = {p["name"]: p["value"] for p in address["endpointProperties"]}
    return flow, Pair(props["authorization"], props["refreshToken"]), props["refreshEndpoint"]


async def _renew(http: httpx.AsyncClient, endpoint: str, pair: Pair, client_jwt: str) -> httpx.Response:
    return await http.post(
        endpoint,
        data={"grant_type": "refresh_token", "refresh_token": pair.refresh},
        headers={"Authorization": f"Bearer {client_jwt}"},
    )


async def _renewed(
    http: httpx.AsyncClient, endpoint: str, pair: Pair, consumer: DidIdentity, client_jwt: str | None = None
) -> Pair:
    r = await _renew(
        http, endpoint, pair, client_jwt or consumer.client_jwt(aud=DEMO_PROVIDER, token=pair.access)
    )
    assert r.status_code == 200, r.text
    return Pair(r.json()["access_token"], r.json()["refresh_token"])


async def _pulls_everywhere(system: System, wire: Wire, access: str) -> None:
    pods, _ = consenting()
    for gateway in system.gateways:
        r = await pull(wire, f"{gateway}/dps/public", access, show=False)
        assert r.status_code == 200, (gateway, r.text)
        assert rows_pods(r) == pods


async def _refused_everywhere(system: System, wire: Wire, access: str, code: str = "pull_token") -> None:
    for gateway in system.gateways:
        r = await pull(wire, f"{gateway}/dps/public", access, show=False)
        assert (r.status_code, r.json()["error"]) == (401, code), (gateway, r.text)
        assert "items" not in r.json()


async def test_http_pull_a_renewed_token_pulls_on_both_replicas_and_the_old_one_dies_on_first_use(
    system: System, did_host: DidWebHost
) -> None:
    assert len(system.gateways) == 2
    wire = Wire(system.http)
    cp = await control_plane_token(wire, system.info)
    consumer = did_host.identity("consumer")
    flow, first, endpoint = await _start(system, wire, cp, consumer)
    assert endpoint == f"{system.info.signaling_url}/dps/token"
    await _pulls_everywhere(system, wire, first.access)
    second = await _renewed(system.http, endpoint, first, consumer)
    await _pulls_everywhere(system, wire, second.access)  # its first use retires the old pair
    await _refused_everywhere(system, wire, first.access)
    stale = await _renew(
        system.http, endpoint, first, consumer.client_jwt(aud=DEMO_PROVIDER, token=first.access)
    )
    assert (stale.status_code, stale.json()["error"]) == (400, "refresh_token_invalid")

    # suspend: neither token of the live pair works, on either replica
    assert (await signal(wire, system.info, cp, flow, "suspend")).status_code == 200
    await _refused_everywhere(system, wire, second.access)
    after = await _renew(
        system.http, endpoint, second, consumer.client_jwt(aud=DEMO_PROVIDER, token=second.access)
    )
    assert (after.status_code, after.json()["error"]) == (400, "refresh_token_invalid")

    # resume: a new pair that pulls and renews
    resumed = await signal(wire, system.info, cp, flow, "resume")
    assert resumed.status_code == 200, resumed.text
    props = {p["name"]: p["value"] for p in resumed.json()["dataAddress"]["endpointProperties"]}
    third = Pair(props["authorization"], props["refreshToken"])
    await _pulls_everywhere(system, wire, third.access)
    fourth = await _renewed(system.http, endpoint, third, consumer)
    await _pulls_everywhere(system, wire, fourth.access)
    await _refused_everywhere(system, wire, second.access)


async def test_http_pull_refused_renewals_change_nothing(system: System, did_host: DidWebHost) -> None:
    wire = Wire(system.http)
    cp = await control_plane_token(wire, system.info)
    consumer = did_host.identity("consumer")
    other = did_host.identity("other")
    unknown = DidIdentity(f"did:web:{did_host.host}:nobody", "key-1", other.key)
    _, pair, endpoint = await _start(system, wire, cp, consumer)
    used = consumer.client_jwt(aud=DEMO_PROVIDER, token=pair.access)
    pair = await _renewed(system.http, endpoint, pair, consumer, used)
    await _pulls_everywhere(system, wire, pair.access)
    forged_key = did_host.identity("forger").key
    attempts: dict[str, tuple[str, str]] = {
        "forged": (
            consumer.client_jwt(aud=DEMO_PROVIDER, token=pair.access, key=forged_key),
            "client_jwt_invalid",
        ),
        "not the counter-party": (
            other.client_jwt(aud=DEMO_PROVIDER, token=pair.access),
            "client_not_counter_party",
        ),
        "replayed jti": (
            consumer.client_jwt(aud=DEMO_PROVIDER, token=pair.access, jti=_claim(used, "jti")),
            "client_jwt_replayed",
        ),
    }
    for name, (client_jwt, code) in attempts.items():
        before = _audited(system, code)
        r = await _renew(system.http, endpoint, pair, client_jwt)
        assert (r.status_code, r.json()["error"]) == (401, code), (name, r.text)
        assert _audited(system, code) == before + 1, name  # GS-02: one record per refusal
    # a flow whose counter-party's DID has no document on its host
    _, lost, _ = await _start(system, wire, cp, unknown)
    before = _audited(system, "client_did_unresolvable")
    r = await _renew(system.http, endpoint, lost, unknown.client_jwt(aud=DEMO_PROVIDER, token=lost.access))
    assert (r.status_code, r.json()["error"]) == (401, "client_did_unresolvable"), r.text
    assert _audited(system, "client_did_unresolvable") == before + 1
    await _pulls_everywhere(system, wire, lost.access)
    # nothing changed: the pair still pulls everywhere and renews once
    await _pulls_everywhere(system, wire, pair.access)
    renewed = await _renewed(system.http, endpoint, pair, consumer)
    await _pulls_everywhere(system, wire, renewed.access)


def _claim(token: str, name: str) -> Any:
    return jwt.decode(token, options={"verify_signature": False})[name]


async def test_http_pull_an_expired_token_is_refused_with_its_code_on_both_replicas_and_renews(
    system: System, did_host: DidWebHost
) -> None:
    """A signaling replica issuing 2-second tokens: once the clock passes the token's exp both
    gateways refuse it with `pull_token_expired`; its refresh token still renews (at the replica
    serving renewals), and the new token pulls on both."""
    instance = await asyncio.to_thread(system.stack.add_instance, "signaling", {"DPS_TOKEN_TTL_SECONDS": "2"})
    try:
        wire = Wire(system.http)
        cp = await control_plane_token(wire, system.info)
        consumer = did_host.identity("consumer")
        short = system.instance_urls()[instance]
        _, pair, endpoint = await _start(system, wire, cp, consumer, signaling=short)
        exp = _claim(pair.access, "exp")
        await asyncio.sleep(max(0.0, exp - time.time()) + 0.1)  # waits for the clock to pass exp
        await _refused_everywhere(system, wire, pair.access, "pull_token_expired")
        renewed = await _renewed(system.http, endpoint, pair, consumer)
        await _pulls_everywhere(system, wire, renewed.access)
    finally:
        await asyncio.to_thread(system.stack.remove_instance, instance)
