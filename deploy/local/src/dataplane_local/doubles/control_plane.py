"""A control-plane double: receives DPS callbacks (`POST [{prefix}]/transfers/{id}/dataflow/{action}`,
under any base path) and records each with its path, body and Authorization header; `status` sets
what it answers (other paths get 404), `delay_s` how long it takes to answer. It also takes
data-plane registrations (`PUT [{prefix}]/dataplanes`, what `signaling register` sends) and records
each with its body and credential headers, answering `registration_status`.

    cp, server = start_control_plane()
    ... signaling calls f"{server.url}/transfers/t1/dataflow/started" ...
    assert cp.calls[0].action == "started"
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from dataplane_local.doubles.server import RunningServer, serve_in_thread

_CALLBACK = re.compile(r"^(?P<base>.*)/transfers/(?P<transfer>[^/]+)/dataflow/(?P<action>[^/]+)$")


@dataclass(frozen=True)
class Callback:
    path: str
    transfer_id: str
    action: str
    body: Any
    authorization: str | None


@dataclass(frozen=True)
class Registration:
    path: str
    body: Any
    authorization: str | None
    api_key: str | None


@dataclass
class ControlPlaneDouble:
    status: int = 200
    delay_s: float = 0.0
    calls: list[Callback] = field(default_factory=list)
    registration_status: int = 200
    registrations: list[Registration] = field(default_factory=list)

    def app(self) -> FastAPI:
        app = FastAPI(title="control-plane-double")

        @app.post("/{path:path}")
        async def callback(path: str, request: Request) -> Response:
            match = _CALLBACK.match(request.url.path)
            if match is None:
                return JSONResponse({"error": "not_found"}, status_code=404)
            raw = await request.body()
            body: Any = None
            if raw:
                try:
                    body = await request.json()
                except ValueError:
                    body = raw.decode(errors="replace")
            self.calls.append(
                Callback(
                    request.url.path,
                    match["transfer"],
                    match["action"],
                    body,
                    request.headers.get("authorization"),
                )
            )
            if self.delay_s > 0:  # a slow control plane: the call is recorded, the answer waits
                await asyncio.sleep(self.delay_s)
            if self.status >= 300:
                return JSONResponse({"error": "refused"}, status_code=self.status)
            return Response(status_code=self.status)

        @app.put("/{path:path}")
        async def register(path: str, request: Request) -> Response:
            if not request.url.path.endswith("/dataplanes"):
                return JSONResponse({"error": "not_found"}, status_code=404)
            headers = request.headers
            body = await request.json()
            self.registrations.append(
                Registration(request.url.path, body, headers.get("authorization"), headers.get("x-api-key"))
            )
            if self.registration_status >= 300:
                # a careless control plane that reflects what it was sent
                return JSONResponse({"error": "refused", "echo": body}, status_code=self.registration_status)
            return JSONResponse(body, status_code=self.registration_status)

        return app


def start_control_plane(status: int = 200) -> tuple[ControlPlaneDouble, RunningServer]:
    cp = ControlPlaneDouble(status=status)
    return cp, serve_in_thread(cp.app())
