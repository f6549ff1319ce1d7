"""The DPS conformance kit's pull cases as our own tests (issue 13; the README's compatibility
table lists each with its outcome). Real HTTP against real processes: the e2e stack (two gateway
replicas, PostgreSQL, the broker, the OIDC issuer double) plus, for this module, a second
synchronous signaling replica and two asynchronous ones (DPS_ASYNC_SIGNALS=true) on the same
flows database, a control-plane double receiving the DPS-12 callbacks and the consumer's did:web
host double. Signals of one flow alternate between replicas.

Every case runs in each spelling of the messages: RC2 (`processId`, `transferType`,
`callbackAddress`: callbacks go there), RC3 (`processId`, `profile`, no `callbackAddress`:
callbacks go to the registered control plane, DPS-11) and the newer draft's `dataFlowId`."""

from __future__ import annotations

import asyncio
import copy
import os
import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from dataplane_contracts.dps import HTTP_PULL_PROFILE, DataFlowStatusMessage, FlowState
from dataplane_local.demo import (
    DEMO_AGREEMENT,
    DEMO_CONSUMER,
    DEMO_DATASET,
    DEMO_PROVIDER,
    Wire,
    consenting,
    control_plane_token,
    pull,
    rows_pods,
)
from dataplane_local.doubles.control_plane import Callback, ControlPlaneDouble, start_control_plane
from dataplane_local.doubles.did_web import DidIdentity, DidWebHost, start_did_web_host
from dataplane_local.procs import record_alive
from dataplane_local.timeouts import scaled
from dataplane_testing.e2e import System

pytestmark = pytest.mark.e2e

SPELLINGS = ["rc2", "rc3", "dataFlowId"]
RC2_BASE, REGISTERED_BASE = "/rc2", "/registered"
ASYNC_ENV = {
    "DPS_ASYNC_SIGNALS": "true",
    "DPS_CALLBACK_RETRY_FIRST_SECONDS": "0.2",
    "DPS_CALLBACK_RETRY_MAX_SECONDS": "1",
}


@dataclass
class Tck:
    system: System
    wire: Wire
    cp: ControlPlaneDouble
    cp_url: str
    token: str
    sync: list[str]  # two signaling replicas answering 200
    asynchronous: list[str]  # two answering 202
    instances: list[str]

    def message(
        self,
        spelling: str,
        flow: str,
        *,
        transfer: str | None = None,
        consumer: str = DEMO_CONSUMER,
        agreement: str = DEMO_AGREEMENT,
    ) -> dict[str, Any]:
        """A prepare/start message in one spelling. RC2 names the transfer `HttpData-PULL`
        unless told, RC3 and the draft the http-pull profile's URI."""
        msg: dict[str, Any] = {
            "messageId": str(uuid.uuid4()),
            "participantId": DEMO_PROVIDER,
            "counterPartyId": consumer,
            "dataspaceContext": "tck",
            "agreementId": agreement,
            "datasetId": DEMO_DATASET,
            "claims": {},
        }
        if spelling == "rc2":
            msg |= {
                "processId": flow,
                "transferType": transfer or "HttpData-PULL",
                "callbackAddress": self.cp_url + RC2_BASE,
            }
        else:
            msg |= {"dataFlowId" if spelling == "dataFlowId" else "processId": flow}
            msg["profile"] = transfer or HTTP_PULL_PROFILE
        return msg

    async def post(self, replica: str, path: str, body: Any = None) -> httpx.Response:
        return await self.wire.http.post(
            f"{replica}/dps/v1/dataflows/{path}",
            json={"messageId": str(uuid.uuid4())} if body is None else body,
            headers={"Authorization": f"Bearer {self.token}"},
        )

    async def state(self, replica: str, flow: str) -> str:
        r = await self.wire.http.get(
            f"{replica}/dps/v1/dataflows/{flow}/status", headers={"Authorization": f"Bearer {self.token}"}
        )
        assert r.status_code == 200, r.text
        assert r.json()["dataFlowId"] == flow
        return str(r.json()["state"])

    async def pulls(self, token: str) -> None:
        pods, _ = consenting()
        for gateway in self.system.gateways:
            r = await pull(self.wire, f"{gateway}/dps/public", token, show=False)
            assert r.status_code == 200, (gateway, r.text)
            assert rows_pods(r) == pods

    async def refused(self, token: str, status: int = 401, code: str = "pull_token") -> None:
        for gateway in self.system.gateways:
            r = await pull(self.wire, f"{gateway}/dps/public", token, show=False)
            assert (r.status_code, r.json()["error"]) == (status, code), (gateway, r.text)
            assert "items" not in r.json()

    async def callbacks(self, flow: str, count: int = 1, timeout: float = 60.0) -> list[Callback]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + scaled(timeout)
        while loop.time() < deadline:
            calls = [c for c in self.cp.calls if c.transfer_id == flow]
            if len(calls) >= count:
                return calls
            await asyncio.sleep(0.05)
        raise AssertionError(f"{count} callback(s) for {flow} never came: {self.cp.calls}")


def _base(spelling: str) -> str:
    return RC2_BASE if spelling == "rc2" else REGISTERED_BASE


def _props(body: dict[str, Any]) -> dict[str, Any]:
    return {p["name"].rsplit("/", 1)[-1]: p["value"] for p in body["dataAddress"]["endpointProperties"]}


def _checked_status(call: Callback) -> DataFlowStatusMessage:
    """A callback body read strictly as the DataFlowStatusMessage it must be (the kit's schema:
    messageId, dataFlowId and state required)."""
    assert isinstance(call.body, dict), call.body
    assert {"messageId", "dataFlowId", "state"} <= set(call.body), call.body
    assert isinstance(call.body["messageId"], str) and call.body["messageId"]
    return DataFlowStatusMessage.model_validate(call.body)


def _consumer_address() -> dict[str, Any]:
    """What a provider's start gave the consumer's control plane (with its credential)."""
    return {
        "@type": "DataAddress",
        "endpointType": HTTP_PULL_PROFILE,
        "endpoint": "https://provider.example/dps/public",
        "endpointProperties": [
            {"@type": "EndpointProperty", "name": "authorization", "value": "provider-secret"},
            {"@type": "EndpointProperty", "name": "authType", "value": "bearer"},
        ],
    }


@pytest.fixture(scope="module")
def did_host() -> Iterator[DidWebHost]:
    host, server = start_did_web_host()
    yield host
    server.stop()


@pytest.fixture(scope="module")
async def tck(system: System) -> AsyncIterator[Tck]:
    cp, server = start_control_plane()
    added: list[str] = []
    try:
        added.append(await asyncio.to_thread(system.stack.add_instance, "signaling", {}))
        for _ in range(2):
            added.append(await asyncio.to_thread(system.stack.add_instance, "signaling", ASYNC_ENV))
        urls = system.instance_urls()
        wire = Wire(system.http)
        token = await control_plane_token(wire, system.info)
        registration = {"controlplaneId": "tck-control-plane", "endpoint": server.url + REGISTERED_BASE}
        r = await system.http.put(
            f"{urls['signaling']}/dps/v1/controlplanes",
            json=registration,
            headers={"Authorization": f"Bearer {token}"},
        )
        assert r.status_code == 200, r.text
        yield Tck(
            system,
            wire,
            cp,
            server.url,
            token,
            sync=[urls["signaling"], urls[added[0]]],
            asynchronous=[urls[added[1]], urls[added[2]]],
            instances=["signaling", *added],
        )
    finally:
        for instance in reversed(added):
            await asyncio.to_thread(system.stack.remove_instance, instance)
        server.stop()


# ---------------------------------------------------------------- provider pull (DP_P_PULL)


async def _started(tck: Tck, spelling: str, replica: str) -> tuple[str, str]:
    flow = f"tck-{uuid.uuid4().hex[:12]}"
    r = await tck.post(replica, "start", tck.message(spelling, flow))
    assert r.status_code == 200, r.text
    assert (r.json()["dataFlowId"], r.json()["state"]) == (flow, "STARTED")
    token = _props(r.json())["authorization"]
    await tck.pulls(token)
    return flow, token


@pytest.mark.parametrize("spelling", SPELLINGS)
async def test_tck_provider_pull_start_then_completed(tck: Tck, spelling: str) -> None:
    a, b = tck.sync
    flow, token = await _started(tck, spelling, a)
    assert (await tck.post(b, f"{flow}/completed", {})).status_code == 200
    assert await tck.state(a, flow) == "COMPLETED"
    await tck.refused(token)


@pytest.mark.parametrize("spelling", SPELLINGS)
async def test_tck_provider_pull_start_then_terminate(tck: Tck, spelling: str) -> None:
    a, b = tck.sync
    flow, token = await _started(tck, spelling, b)
    assert (await tck.post(a, f"{flow}/terminate")).status_code == 200
    assert await tck.state(b, flow) == "TERMINATED"
    await tck.refused(token)


@pytest.mark.parametrize("spelling", SPELLINGS)
async def test_tck_provider_pull_start_suspend_resume_answers_started(tck: Tck, spelling: str) -> None:
    a, b = tck.sync
    flow, token = await _started(tck, spelling, a)
    suspend = {"messageId": str(uuid.uuid4()), "reason": "tck"}
    assert (await tck.post(b, f"{flow}/suspend", suspend)).status_code == 200
    assert await tck.state(a, flow) == "SUSPENDED"
    await tck.refused(token, 401)
    resumed = await tck.post(a, f"{flow}/resume")
    assert resumed.status_code == 200, resumed.text
    assert (resumed.json()["dataFlowId"], resumed.json()["state"]) == (flow, "STARTED")
    renewed = _props(resumed.json())["authorization"]
    await tck.pulls(renewed)
    await tck.refused(token)  # the suspended flow's token stays dead
    assert await tck.state(b, flow) == "STARTED"


@pytest.mark.parametrize("spelling", SPELLINGS)
async def test_tck_provider_pull_start_suspend_terminate(tck: Tck, spelling: str) -> None:
    a, b = tck.sync
    flow, token = await _started(tck, spelling, b)
    assert (await tck.post(a, f"{flow}/suspend")).status_code == 200
    assert (await tck.post(b, f"{flow}/terminate")).status_code == 200
    assert await tck.state(a, flow) == "TERMINATED"
    await tck.refused(token)


@pytest.mark.parametrize("spelling", SPELLINGS)
async def test_tck_provider_pull_async_start_then_the_started_callback(tck: Tck, spelling: str) -> None:
    c, d = tck.asynchronous
    flow = f"tck-{uuid.uuid4().hex[:12]}"
    r = await tck.post(c, "start", tck.message(spelling, flow))
    assert r.status_code == 202, r.text
    assert (r.json()["dataFlowId"], r.json()["state"]) == (flow, "STARTING")
    assert "dataAddress" not in r.json()
    assert r.headers["location"] == f"/dps/v1/dataflows/{flow}/status"
    [call] = await tck.callbacks(flow)
    assert call.path == f"{_base(spelling)}/transfers/{flow}/dataflow/started"
    assert call.authorization is not None and call.authorization.startswith("Bearer ")
    sent = _checked_status(call)
    assert (sent.data_flow_id, sent.state) == (flow, FlowState.STARTED)
    assert sent.data_address is not None
    await tck.pulls(_props(call.body)["authorization"])
    assert await tck.state(d, flow) == "STARTED"
    assert (await tck.post(d, f"{flow}/terminate")).status_code == 200


# ---------------------------------------------------------------- the http-pull profile (DP_P_HTTP_PULL)


async def _profile_flow(tck: Tck, spelling: str, consumer: DidIdentity) -> tuple[str, dict[str, Any]]:
    """A profile flow for `consumer` (a did:web identity) under a new agreement of its own."""
    system = tck.system
    agreement = f"agr-{uuid.uuid4().hex[:10]}"
    entries = copy.deepcopy(system.policy["agreements"][DEMO_AGREEMENT]["datasets"])
    system.policy["agreements"][agreement] = {"consumer": consumer.did, "datasets": entries}
    await system.ds_control({"action": "policy", "policy": system.policy})
    flow = f"tck-{uuid.uuid4().hex[:12]}"
    msg = tck.message(spelling, flow, transfer=HTTP_PULL_PROFILE, consumer=consumer.did, agreement=agreement)
    r = await tck.post(tck.sync[1], "start", msg)
    assert r.status_code == 200, r.text
    address = r.json()["dataAddress"]
    assert address["endpointType"] == HTTP_PULL_PROFILE
    return flow, _props(r.json())


async def _refresh(tck: Tck, props: dict[str, Any], refresh_token: str, client_jwt: str) -> httpx.Response:
    return await tck.wire.http.post(
        props["refreshEndpoint"],
        data={"grant_type": "refresh_token", "refresh_token": refresh_token},
        headers={"Authorization": f"Bearer {client_jwt}"},
    )


def _audited(tck: Tck, reason: str) -> int:
    """Refusals with this reason audited by the replica serving renewals (DPS_SIGNALING_URL's)."""
    return tck.system.audited("signaling", "dps.token_refresh", reason)


@pytest.mark.parametrize("spelling", SPELLINGS)
async def test_tck_http_profile_start_and_refresh(tck: Tck, did_host: DidWebHost, spelling: str) -> None:
    consumer = did_host.identity("tck-consumer")
    flow, props = await _profile_flow(tck, spelling, consumer)
    assert props["authType"] == "bearer" and props["authorization"] and props["refreshToken"]
    assert str(props["expiresIn"]).isdigit()
    assert props["refreshEndpoint"].endswith("/dps/token")
    await tck.pulls(props["authorization"])
    r = await _refresh(
        tck,
        props,
        props["refreshToken"],
        consumer.client_jwt(aud=DEMO_PROVIDER, token=props["authorization"]),
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["token_type"].lower() == "bearer" and isinstance(body["expires_in"], int)
    assert body["refresh_token"] != props["refreshToken"]
    await tck.pulls(body["access_token"])
    await tck.refused(props["authorization"])  # the new token was used: the old pair is dead
    assert (await tck.post(tck.sync[0], f"{flow}/terminate")).status_code == 200


@pytest.mark.parametrize("spelling", SPELLINGS)
async def test_tck_http_profile_refresh_with_a_never_issued_token_is_refused(
    tck: Tck, did_host: DidWebHost, spelling: str
) -> None:
    consumer = did_host.identity("tck-consumer")
    flow, props = await _profile_flow(tck, spelling, consumer)
    before = _audited(tck, "refresh_token_invalid")
    client_jwt = consumer.client_jwt(aud=DEMO_PROVIDER, token=props["authorization"])
    r = await _refresh(tck, props, "never-issued-" + uuid.uuid4().hex, client_jwt)
    assert (r.status_code, r.json()["error"]) == (400, "refresh_token_invalid"), r.text
    assert _audited(tck, "refresh_token_invalid") == before + 1
    await tck.pulls(props["authorization"])  # nothing changed
    assert (await tck.post(tck.sync[0], f"{flow}/terminate")).status_code == 200


@pytest.mark.parametrize("spelling", SPELLINGS)
async def test_tck_http_profile_refresh_with_a_client_jwt_of_the_wrong_audience_is_refused(
    tck: Tck, did_host: DidWebHost, spelling: str
) -> None:
    consumer = did_host.identity("tck-consumer")
    flow, props = await _profile_flow(tck, spelling, consumer)
    before = _audited(tck, "client_audience")
    wrong = consumer.client_jwt(aud="did:web:someone-else.example", token=props["authorization"])
    r = await _refresh(tck, props, props["refreshToken"], wrong)
    assert (r.status_code, r.json()["error"]) == (401, "client_audience"), r.text
    assert _audited(tck, "client_audience") == before + 1
    await tck.pulls(props["authorization"])
    right = consumer.client_jwt(aud=DEMO_PROVIDER, token=props["authorization"])
    assert (await _refresh(tck, props, props["refreshToken"], right)).status_code == 200  # still live
    assert (await tck.post(tck.sync[0], f"{flow}/terminate")).status_code == 200


async def test_http_pull_after_suspend_no_token_works_on_any_replica_and_resume_renews_on_the_other(
    tck: Tck, did_host: DidWebHost
) -> None:
    """Renewal with two signaling replicas: after suspend neither the access token (either
    gateway) nor the refresh token (either signaling replica) works; resume's pair pulls on both
    gateways and renews at the replica that did not answer the resume."""
    consumer = did_host.identity("tck-consumer")
    flow, props = await _profile_flow(tck, "rc3", consumer)
    a, b = tck.sync
    assert (await tck.post(a, f"{flow}/suspend")).status_code == 200
    await tck.refused(props["authorization"])
    for replica in tck.sync:
        at = {**props, "refreshEndpoint": f"{replica}/dps/token"}
        jwt_ = consumer.client_jwt(aud=DEMO_PROVIDER, token=props["authorization"])
        r = await _refresh(tck, at, props["refreshToken"], jwt_)
        assert (r.status_code, r.json()["error"]) == (400, "refresh_token_invalid"), (replica, r.text)
    resumed = await tck.post(b, f"{flow}/resume")
    assert resumed.status_code == 200, resumed.text
    fresh = _props(resumed.json())
    await tck.pulls(fresh["authorization"])
    at = {**fresh, "refreshEndpoint": f"{a}/dps/token"}
    r = await _refresh(
        tck, at, fresh["refreshToken"], consumer.client_jwt(aud=DEMO_PROVIDER, token=fresh["authorization"])
    )
    assert r.status_code == 200, r.text
    await tck.pulls(r.json()["access_token"])
    await tck.refused(props["authorization"])
    assert (await tck.post(a, f"{flow}/terminate")).status_code == 200


# ---------------------------------------------------------------- consumer pull (DP_C_PULL)


async def _prepared_and_started(tck: Tck, spelling: str) -> str:
    a, b = tck.sync
    flow = f"tck-{uuid.uuid4().hex[:12]}"
    r = await tck.post(a, "prepare", tck.message(spelling, flow))
    assert r.status_code == 200, r.text
    assert (r.json()["dataFlowId"], r.json()["state"]) == (flow, "PREPARED")
    assert "dataAddress" not in r.json()
    started = {"messageId": str(uuid.uuid4()), "dataAddress": _consumer_address()}
    assert (await tck.post(b, f"{flow}/started", started)).status_code == 200
    assert await tck.state(a, flow) == "STARTED"
    return flow


@pytest.mark.parametrize("spelling", SPELLINGS)
async def test_tck_consumer_pull_prepare_started_terminate(tck: Tck, spelling: str) -> None:
    flow = await _prepared_and_started(tck, spelling)
    a, b = tck.sync
    assert (await tck.post(a, f"{flow}/terminate")).status_code == 200
    assert await tck.state(b, flow) == "TERMINATED"


@pytest.mark.parametrize("spelling", SPELLINGS)
async def test_tck_consumer_pull_suspend_resume_answers_started(tck: Tck, spelling: str) -> None:
    flow = await _prepared_and_started(tck, spelling)
    a, b = tck.sync
    assert (await tck.post(b, f"{flow}/suspend")).status_code == 200
    assert await tck.state(a, flow) == "SUSPENDED"
    resume = {"messageId": str(uuid.uuid4()), "dataAddress": _consumer_address()}
    resumed = await tck.post(a, f"{flow}/resume", resume)
    assert resumed.status_code == 200, resumed.text
    assert resumed.json()["state"] == "STARTED"
    assert await tck.state(b, flow) == "STARTED"


@pytest.mark.parametrize("spelling", SPELLINGS)
async def test_tck_consumer_pull_suspend_terminate(tck: Tck, spelling: str) -> None:
    flow = await _prepared_and_started(tck, spelling)
    a, b = tck.sync
    assert (await tck.post(a, f"{flow}/suspend")).status_code == 200
    assert (await tck.post(b, f"{flow}/terminate")).status_code == 200
    assert await tck.state(a, flow) == "TERMINATED"


@pytest.mark.parametrize("spelling", SPELLINGS)
async def test_tck_consumer_started_without_a_data_address_is_refused_as_dps07_says(
    tck: Tck, spelling: str
) -> None:
    """The kit's consumer `started` may come without an address; DPS-07 requires one (a pull
    consumer has nothing to pull from otherwise): the documented deviation."""
    a, b = tck.sync
    flow = f"tck-{uuid.uuid4().hex[:12]}"
    assert (await tck.post(a, "prepare", tck.message(spelling, flow))).status_code == 200
    r = await tck.post(b, f"{flow}/started")
    assert (r.status_code, r.json()["error"]) == (400, "data_address_required"), r.text
    assert await tck.state(a, flow) == "PREPARED"


@pytest.mark.parametrize("spelling", SPELLINGS)
async def test_tck_consumer_pull_async_prepare_then_the_prepared_callback(tck: Tck, spelling: str) -> None:
    c, d = tck.asynchronous
    flow = f"tck-{uuid.uuid4().hex[:12]}"
    r = await tck.post(d, "prepare", tck.message(spelling, flow))
    assert r.status_code == 202, r.text
    assert (r.json()["dataFlowId"], r.json()["state"]) == (flow, "PREPARING")
    assert r.headers["location"] == f"/dps/v1/dataflows/{flow}/status"
    [call] = await tck.callbacks(flow)
    assert call.path == f"{_base(spelling)}/transfers/{flow}/dataflow/prepared"
    sent = _checked_status(call)
    assert (sent.data_flow_id, sent.state, sent.data_address) == (flow, FlowState.PREPARED, None)
    assert await tck.state(c, flow) == "PREPARED"


# ---------------------------------------------------------------- at least once across a crash


def _kill(system: System, instance: str) -> None:
    """SIGKILL the instance's process group: no shutdown code runs (a crash)."""
    for rec in system.stack.records:
        if rec.name == instance and record_alive(rec):
            if rec.group:
                os.killpg(rec.pid, signal.SIGKILL)
            else:
                os.kill(rec.pid, signal.SIGKILL)


async def _dead(system: System, instance: str, timeout: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + scaled(timeout)
    while any(r.name == instance and record_alive(r) for r in system.stack.records):
        assert loop.time() < deadline, f"{instance} survived SIGKILL"
        await asyncio.sleep(0.05)


async def test_dps12_the_started_callback_survives_every_signaling_being_killed_after_the_202(
    tck: Tck,
) -> None:
    """The control plane refuses the callback until every signaling replica has been killed;
    then it accepts, one replica restarts, and the callback owed since the 202 arrives."""
    system = tck.system
    flow = f"tck-{uuid.uuid4().hex[:12]}"
    tck.cp.status = 503
    try:
        r = await tck.post(tck.asynchronous[0], "start", tck.message("rc3", flow))
        assert (r.status_code, r.json()["state"]) == (202, "STARTING"), r.text
        refused = await tck.callbacks(flow)  # at least one attempt refused before the crash
        for instance in tck.instances:
            _kill(system, instance)
        for instance in tck.instances:
            await _dead(system, instance)
        tck.cp.status = 200
        seen = len([c for c in tck.cp.calls if c.transfer_id == flow])
        assert seen >= len(refused)
        await asyncio.to_thread(system.stack.start_service, "signaling", 120.0)
        calls = await tck.callbacks(flow, count=seen + 1)
        sent = _checked_status(calls[-1])
        assert (sent.data_flow_id, sent.state) == (flow, FlowState.STARTED)
        assert calls[-1].path == f"{REGISTERED_BASE}/transfers/{flow}/dataflow/started"
        await tck.pulls(_props(calls[-1].body)["authorization"])
        assert await tck.state(tck.sync[0], flow) == "STARTED"
    finally:
        tck.cp.status = 200
        for instance in tck.instances:
            if not any(r.name == instance and record_alive(r) for r in system.stack.records):
                await asyncio.to_thread(system.stack.start_service, instance, 120.0)
