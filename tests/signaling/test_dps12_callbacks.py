"""DPS-12 — callbacks to the control plane through ControlPlaneClient."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import jwt
import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from dataplane_contracts.dps import DataFlowStatusMessage, FlowState
from dataplane_local.doubles.oidc import OidcIssuer
from dataplane_local.infra import free_port
from dataplane_service_kit.oauth import ClientCredentialsToken
from dataplane_testing.signaling import CP, FLOWS, SERVICE_CLIENT, SERVICE_SECRET, auth, new_id, start_message
from signaling import repository
from signaling.callbacks import CallbackFailed, ControlPlaneClient


@pytest.fixture
async def cp_client(signaling: Any, oidc: OidcIssuer) -> AsyncIterator[ControlPlaneClient]:
    engine = create_async_engine(signaling.settings.database_url)
    async with httpx.AsyncClient() as http:
        token_url = oidc.base_url + "/protocol/openid-connect/token"
        tokens = ClientCredentialsToken(
            http, token_url=token_url, client_id=SERVICE_CLIENT, client_secret=SERVICE_SECRET
        )
        yield ControlPlaneClient(http, engine, tokens, timeout=2)
    await engine.dispose()


async def _flow(signaling: Any, cp_token: Any, callback: str | None) -> repository.FlowRecord:
    flow = new_id()
    msg = start_message(flow, callbackAddress=callback)
    assert (
        await signaling.client.post(f"{FLOWS}/prepare", json=msg, headers=auth(cp_token()))
    ).status_code == 200
    engine = create_async_engine(signaling.settings.database_url)
    try:
        async with engine.connect() as conn:
            record = await repository.get_flow(conn, flow, CP)
    finally:
        await engine.dispose()
    assert record is not None
    return record


async def test_dps12_a_notification_follows_edc_signaling_paths(
    signaling: Any, cp_token: Any, cp_client: ControlPlaneClient, control_plane: Any
) -> None:
    cp, url = control_plane
    flow = await _flow(signaling, cp_token, url + "/api/")
    msg = DataFlowStatusMessage(data_flow_id=flow.id, state=FlowState.STARTED)
    await cp_client.notify(flow, "started", msg)
    [call] = cp.calls
    assert (call.transfer_id, call.action) == (flow.id, "started")
    assert call.path == f"/api/transfers/{flow.id}/dataflow/started"
    assert call.body == msg.wire()
    assert call.authorization is not None and call.authorization.startswith("Bearer ")
    claims = jwt.decode(call.authorization[7:], options={"verify_signature": False})
    assert claims["azp"] == SERVICE_CLIENT and claims["gty"] == "client-credentials"


async def test_dps12_completed_may_send_an_empty_object(
    signaling: Any, cp_token: Any, cp_client: ControlPlaneClient, control_plane: Any
) -> None:
    cp, url = control_plane
    flow = await _flow(signaling, cp_token, url)
    await cp_client.notify(flow, "completed")
    assert cp.calls[0].body == {} and cp.calls[0].action == "completed"


async def test_dps12_a_refusal_is_a_failure(
    signaling: Any, cp_token: Any, cp_client: ControlPlaneClient, control_plane: Any
) -> None:
    cp, url = control_plane
    cp.status = 401
    flow = await _flow(signaling, cp_token, url)
    with pytest.raises(CallbackFailed, match="401"):
        await cp_client.notify(flow, "errored")


async def test_dps12_an_unreachable_control_plane_is_a_failure(
    signaling: Any, cp_token: Any, cp_client: ControlPlaneClient
) -> None:
    flow = await _flow(signaling, cp_token, f"http://127.0.0.1:{free_port()}")
    with pytest.raises(CallbackFailed, match="unreachable"):
        await cp_client.notify(flow, "prepared")


async def test_dps12_no_base_is_a_failure(
    signaling: Any, cp_token: Any, cp_client: ControlPlaneClient
) -> None:
    flow = await _flow(signaling, cp_token, None)
    with pytest.raises(CallbackFailed, match="no callback address"):
        await cp_client.notify(flow, "started")


async def test_dps12_only_spec_callbacks_exist(
    signaling: Any, cp_token: Any, cp_client: ControlPlaneClient, control_plane: Any
) -> None:
    _, url = control_plane
    flow = await _flow(signaling, cp_token, url)
    for action in ("terminated", "suspended", "../x"):
        with pytest.raises(ValueError, match="no DPS callback"):
            await cp_client.notify(flow, action)


async def test_dps12_control_plane_registration_supplies_the_callback_base(
    signaling: Any, cp_token: Any, cp_client: ControlPlaneClient, control_plane: Any
) -> None:
    cp, url = control_plane
    body = {"controlplaneId": "cp-main", "endpoint": url + "/signaling"}
    assert (
        await signaling.client.put("/dps/v1/controlplanes", json=body, headers=auth(cp_token()))
    ).status_code == 200
    flow = await _flow(signaling, cp_token, None)
    await cp_client.notify(flow, "prepared")
    assert [c.path for c in cp.calls] == [f"/signaling/transfers/{flow.id}/dataflow/prepared"]
