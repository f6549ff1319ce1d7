"""DPS-12: notifications to the control plane.

`POST {base}/transfers/{id}/dataflow/{prepared|started|completed|errored}` with a
DataFlowStatusMessage (or `{}`) and this service's client-credentials bearer token. The base is the
flow's `callbackAddress`, else the endpoint the same caller registered (DPS-11). No base, a
transport error or a non-2xx answer is a CallbackFailed. No synchronous signal sends one today;
this is the client a long-running flow uses."""

from __future__ import annotations

from typing import Any

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from dataplane_contracts.dps import CALLBACK_ACTIONS, DataFlowStatusMessage
from dataplane_service_kit.oauth import ClientCredentialsToken, TokenUnavailable
from signaling import repository
from signaling.repository import FlowRecord


class CallbackFailed(Exception):
    """The notification did not reach the control plane, or it refused it."""


class ControlPlaneClient:
    def __init__(
        self,
        http: httpx.AsyncClient,
        engine: AsyncEngine,
        tokens: ClientCredentialsToken | None,
        timeout: float = 5.0,
    ) -> None:
        self._http = http
        self._engine = engine
        self._tokens = tokens
        self._timeout = timeout

    async def base_for(self, flow: FlowRecord) -> str | None:
        if flow.callback_address:
            return flow.callback_address
        async with self._engine.connect() as conn:
            return await repository.registered_endpoint(conn, flow.caller)

    async def notify(
        self, flow: FlowRecord, action: str, message: DataFlowStatusMessage | None = None
    ) -> None:
        if action not in CALLBACK_ACTIONS:
            raise ValueError(f"no DPS callback named {action!r}")
        base = await self.base_for(flow)
        if not base:
            raise CallbackFailed("no callback address and no registered control plane")
        url = f"{base.rstrip('/')}/transfers/{flow.id}/dataflow/{action}"
        headers: dict[str, str] = {}
        if self._tokens is not None:
            try:
                token = await self._tokens.get()
            except TokenUnavailable as exc:
                raise CallbackFailed("this service's token could not be obtained") from exc
            if token:
                headers["Authorization"] = f"Bearer {token}"
        body: dict[str, Any] = {} if message is None else message.wire()
        try:
            resp = await self._http.post(url, json=body, headers=headers, timeout=self._timeout)
        except httpx.HTTPError as exc:
            raise CallbackFailed(f"control plane unreachable ({type(exc).__name__})") from exc
        if resp.status_code >= 300:
            raise CallbackFailed(f"control plane answered {resp.status_code}")
