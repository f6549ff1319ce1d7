"""Asynchronous signals (DPS_ASYNC_SIGNALS, issue 13): prepare and start answer 202 with
PREPARING / STARTING and a Location, the transition finishes in the background and the DPS-12
callback (`prepared` / `started`) is delivered at least once from the `dps_callbacks` outbox.

Where a test must see the intermediate state, the app that answers the 202 runs no callback relay
(DPS_CALLBACK_RELAY_ENABLED=false) and a second app on the same database delivers: two replicas."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import jwt
import pytest

from dataplane_contracts.dps import DataFlowStatusMessage, FlowState
from dataplane_local.doubles.control_plane import Callback, ControlPlaneDouble
from dataplane_local.timeouts import scaled
from dataplane_testing.signaling import (
    FLOWS,
    auth,
    events_for,
    live_grants,
    new_id,
    read_flow_events,
    run_app,
    sql,
    start_message,
    token_of,
)

FAST_RETRY = {"dps_callback_retry_first_seconds": 0.05, "dps_callback_retry_max_seconds": 0.2}


def _async(values: dict[str, Any], relay: bool = True, **more: Any) -> dict[str, Any]:
    return {**values, **FAST_RETRY, "dps_async_signals": True, "dps_callback_relay_enabled": relay, **more}


async def _calls(cp: ControlPlaneDouble, flow: str, count: int = 1, timeout: float = 20.0) -> list[Callback]:
    """The double's callbacks for `flow` once there are `count` of them."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + scaled(timeout)
    while loop.time() < deadline:
        calls = [c for c in cp.calls if c.transfer_id == flow]
        if len(calls) >= count:
            return calls
        await asyncio.sleep(0.02)
    raise AssertionError(f"{count} callback(s) for {flow} never arrived: {cp.calls}")


async def _owed(db: str, flow: str) -> list[dict[str, Any]]:
    rows = await sql(db, "SELECT * FROM dps_callbacks WHERE flow_id = $1 ORDER BY id", flow)
    return [dict(r) for r in rows]


async def _finished(db: str, flow: str, timeout: float = 20.0) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + scaled(timeout)
    while loop.time() < deadline:
        [row] = await _owed(db, flow)
        if row["finished_at"] is not None:
            return row
        await asyncio.sleep(0.02)
    raise AssertionError(f"the callback of {flow} was never finished")


def _status_message(call: Callback) -> DataFlowStatusMessage:
    """The callback body read strictly as the DataFlowStatusMessage it must be."""
    assert isinstance(call.body, dict)
    assert {"messageId", "dataFlowId", "state"} <= set(call.body), call.body
    return DataFlowStatusMessage.model_validate(call.body)


async def test_dps12_async_start_answers_202_then_the_started_callback_carries_the_address(
    base_settings: dict[str, Any], cp_token: Callable[..., str], control_plane: Any
) -> None:
    cp, url = control_plane
    flow = new_id()
    db = base_settings["database_url"]
    async with run_app(_async(base_settings, relay=False)) as answering:
        r = await answering.client.post(
            f"{FLOWS}/start", json=start_message(flow, callbackAddress=url + "/rc2"), headers=auth(cp_token())
        )
        assert r.status_code == 202, r.text
        assert r.headers["location"] == f"{FLOWS}/{flow}/status"
        assert r.json()["state"] == "STARTING" and "dataAddress" not in r.json()
        status = await answering.client.get(r.headers["location"], headers=auth(cp_token()))
        assert status.json() == {"dataFlowId": flow, "state": "STARTING"}
        assert not [g for g in (await live_grants(db)).values() if g["flow_id"] == flow]
        assert [row["action"] for row in await _owed(db, flow)] == ["started"]
        async with run_app(_async(base_settings)) as delivering:
            [call] = await _calls(cp, flow)
            assert call.path == f"/rc2/transfers/{flow}/dataflow/started"
            msg = _status_message(call)
            assert (msg.data_flow_id, msg.state) == (flow, FlowState.STARTED)
            assert (
                msg.data_address is not None
                and msg.data_address.endpoint == "https://gateway.example/dps/public"
            )
            assert call.authorization is not None and call.authorization.startswith("Bearer ")
            row = await _finished(db, flow)
            assert (row["outcome"], row["attempts"]) == ("delivered", 1)
            status = await delivering.client.get(f"{FLOWS}/{flow}/status", headers=auth(cp_token()))
            assert status.json()["state"] == "STARTED"
    grants = [g for g in (await live_grants(db)).values() if g["flow_id"] == flow]
    assert len(grants) == 1 and grants[0]["state"] == "STARTED"
    token = token_of(call.body)
    assert token not in str(await _owed(db, flow))  # the outbox row never held the credential
    records = await read_flow_events(
        base_settings["kafka_bootstrap_servers"], lambda rs: len(events_for(rs, flow)) >= 2
    )
    assert [(e["previous_state"], e["state"]) for e in events_for(records, flow)] == [
        (None, "STARTING"),
        ("STARTING", "STARTED"),
    ]


async def test_dps12_async_prepare_calls_back_the_registered_endpoint_without_a_callback_address(
    base_settings: dict[str, Any], cp_token: Callable[..., str], control_plane: Any
) -> None:
    cp, url = control_plane
    flow = new_id()
    async with run_app(_async(base_settings)) as app:
        registration = {"controlplaneId": "cp-async", "endpoint": url + "/registered"}
        assert (
            await app.client.put("/dps/v1/controlplanes", json=registration, headers=auth(cp_token()))
        ).status_code == 200
        rc3 = start_message(flow, callbackAddress=..., transferType=..., profile="HttpData-PULL")
        r = await app.client.post(f"{FLOWS}/prepare", json=rc3, headers=auth(cp_token()))
        assert (r.status_code, r.json()["state"]) == (202, "PREPARING"), r.text
        [call] = await _calls(cp, flow)
        assert call.path == f"/registered/transfers/{flow}/dataflow/prepared"
        msg = _status_message(call)
        assert (msg.state, msg.data_address) == (FlowState.PREPARED, None)
        status = await app.client.get(f"{FLOWS}/{flow}/status", headers=auth(cp_token()))
        assert status.json()["state"] == "PREPARED"


async def test_dps12_async_signal_with_nowhere_to_call_back_is_refused_and_stores_nothing(
    base_settings: dict[str, Any], cp_token: Callable[..., str]
) -> None:
    flow = new_id()
    async with run_app(_async(base_settings)) as app:
        for signal in ("prepare", "start"):
            r = await app.client.post(f"{FLOWS}/{signal}", json=start_message(flow), headers=auth(cp_token()))
            assert (r.status_code, r.json()["error"]) == (400, "callback_address_required"), r.text
        status = await app.client.get(f"{FLOWS}/{flow}/status", headers=auth(cp_token()))
        assert status.status_code == 404
    assert await _owed(base_settings["database_url"], flow) == []


async def test_dps12_a_refused_callback_is_retried_and_only_the_last_address_is_live(
    base_settings: dict[str, Any], cp_token: Callable[..., str], control_plane: Any
) -> None:
    cp, url = control_plane
    cp.status = 503
    flow = new_id()
    db = base_settings["database_url"]
    async with run_app(_async(base_settings)) as app:
        r = await app.client.post(
            f"{FLOWS}/start", json=start_message(flow, callbackAddress=url), headers=auth(cp_token())
        )
        assert r.status_code == 202, r.text
        refused = await _calls(cp, flow, count=2)
        cp.status = 200
        calls = await _calls(cp, flow, count=len(refused) + 1)
        row = await _finished(db, flow)
        assert row["outcome"] == "delivered" and row["attempts"] >= 3
    tokens = [token_of(c.body) for c in calls]
    assert len(set(tokens)) == len(tokens)  # each attempt carried new credentials
    grants = await live_grants(db)
    assert [g["flow_id"] for g in grants.values()].count(flow) == 1
    # the last address sent is the live one: the earlier ones died with their attempt
    live = {tid for tid, g in grants.items() if g["flow_id"] == flow}
    assert live == {_jti(tokens[-1])}


def _jti(token: str) -> str:
    return str(jwt.decode(token, options={"verify_signature": False})["jti"])


async def test_dps12_a_flow_terminated_while_starting_owes_no_callback(
    base_settings: dict[str, Any], cp_token: Callable[..., str], control_plane: Any
) -> None:
    cp, url = control_plane
    flow = new_id()
    db = base_settings["database_url"]
    async with run_app(_async(base_settings, relay=False)) as answering:
        r = await answering.client.post(
            f"{FLOWS}/start", json=start_message(flow, callbackAddress=url), headers=auth(cp_token())
        )
        assert r.status_code == 202
        assert (
            await answering.client.post(f"{FLOWS}/{flow}/terminate", headers=auth(cp_token()))
        ).status_code == 200
    async with run_app(_async(base_settings)):
        row = await _finished(db, flow)
    assert row["outcome"] == "dropped"
    assert [c for c in cp.calls if c.transfer_id == flow] == []
    assert not [g for g in (await live_grants(db)).values() if g["flow_id"] == flow]


async def test_dps12_a_flow_that_cannot_proceed_is_terminated_and_errored_is_sent(
    base_settings: dict[str, Any], cp_token: Callable[..., str], control_plane: Any
) -> None:
    """A replica that no longer serves the flow's transfer type (a configuration change between
    the 202 and the completion) cannot start it: TERMINATED, and the control plane is told."""
    cp, url = control_plane
    flow = new_id()
    both = ["HttpData-PULL", "http-pull"]
    async with run_app(_async(base_settings, relay=False, dps_transfer_types=both)) as answering:
        msg = start_message(flow, callbackAddress=url, transferType="http-pull")
        r = await answering.client.post(f"{FLOWS}/start", json=msg, headers=auth(cp_token()))
        assert r.status_code == 202, r.text
    async with run_app(_async(base_settings, dps_transfer_types=["HttpData-PULL"])) as delivering:
        [call] = await _calls(cp, flow)
        assert call.action == "errored"
        sent = _status_message(call)
        assert sent.state is FlowState.TERMINATED and sent.error and sent.data_address is None
        status = await delivering.client.get(f"{FLOWS}/{flow}/status", headers=auth(cp_token()))
        assert status.json()["state"] == "TERMINATED"


@pytest.mark.parametrize("signal", ["prepare", "start"])
async def test_dps12_synchronous_signals_stay_200_without_callbacks(
    base_settings: dict[str, Any], cp_token: Callable[..., str], control_plane: Any, signal: str
) -> None:
    cp, url = control_plane
    flow = new_id()
    async with run_app(base_settings) as app:
        r = await app.client.post(
            f"{FLOWS}/{signal}", json=start_message(flow, callbackAddress=url), headers=auth(cp_token())
        )
        assert r.status_code == 200 and "location" not in r.headers
    assert await _owed(base_settings["database_url"], flow) == []
    assert cp.calls == []


async def test_dps12_a_callback_in_flight_is_not_sent_again_by_another_replica(
    base_settings: dict[str, Any], cp_token: Callable[..., str], control_plane: Any
) -> None:
    """Two replicas relay; the control plane takes 2 s to answer, far beyond the retry delay. The
    claim's lease covers the attempt, so the other replica never sends the flow a second address
    while the first is in flight: one call, one attempt."""
    cp, url = control_plane
    cp.delay_s = 2.0
    flow = new_id()
    db = base_settings["database_url"]
    async with run_app(_async(base_settings)) as one, run_app(_async(base_settings)):
        r = await one.client.post(
            f"{FLOWS}/start", json=start_message(flow, callbackAddress=url), headers=auth(cp_token())
        )
        assert r.status_code == 202, r.text
        row = await _finished(db, flow)
    assert (row["outcome"], row["attempts"]) == ("delivered", 1)
    assert len([c for c in cp.calls if c.transfer_id == flow]) == 1
