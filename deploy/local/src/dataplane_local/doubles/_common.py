"""Shared machinery of the DEVELOPMENT DOUBLES: programmable faults, call recording, bearer checks
and the `python -m dataplane_local.doubles.<name> --port N --config file.yaml` entry point.

A double's state is touched by the uvicorn thread and by the test thread at once, so every
mutable structure here is guarded by a lock."""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import jwt
import uvicorn
import yaml
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response


@dataclass
class Fault:
    """Answer `status` (with `body` as JSON, or `text` as text/plain) instead of the real answer.

    It applies to calls of `endpoint` ("*" = every endpoint) of `participant` ("*" = every one;
    only the ds double has participants). It lasts for the next `count` calls, or for `seconds`,
    or until cleared when neither is given. `delay_seconds` waits before answering (a slow peer);
    a fault with a delay and no status then gives the real answer."""

    endpoint: str = "*"
    status: int | None = 503
    body: Any = None
    text: str | None = None
    count: int | None = None
    seconds: float | None = None
    delay_seconds: float = 0.0
    participant: str = "*"
    expires_at: float | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Fault:
        allowed = {"endpoint", "status", "body", "text", "count", "seconds", "delay_seconds", "participant"}
        unknown = set(data) - allowed
        if unknown:
            raise ValueError(f"unknown fault fields: {sorted(unknown)}")
        fault = cls(**{k: v for k, v in data.items() if k in allowed})
        if fault.participant is None:
            fault.participant = ""
        return fault

    def matches(self, endpoint: str, participant: str) -> bool:
        return self.endpoint in ("*", endpoint) and self.participant in ("*", participant)

    def response(self) -> Response | None:
        if self.status is None:
            return None
        if self.text is not None:
            return PlainTextResponse(self.text, status_code=self.status)
        body = self.body if self.body is not None else {"detail": f"injected fault {self.status}"}
        return JSONResponse(body, status_code=self.status)


@dataclass
class Call:
    endpoint: str
    participant: str
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    status: int
    at: float = field(default_factory=time.time)
    # what the double answered, where a reader needs it (the ds double's decisions: the demo shows
    # the verdict the gateway got); None for the rest
    answer: Any = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "endpoint": self.endpoint,
            "participant": self.participant,
            "method": self.method,
            "path": self.path,
            "headers": self.headers,
            "body": self.body,
            "status": self.status,
            "at": self.at,
            "answer": self.answer,
        }


class DoubleBase:
    """Faults and the call log, common to every double."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._faults: list[Fault] = []
        self._calls: list[Call] = []

    # -- faults -------------------------------------------------------------------------------
    def set_fault(self, fault: Fault | None = None, /, **kwargs: Any) -> Fault:
        """Add a fault (a `Fault`, or its fields as keywords). Newest fault wins."""
        fault = fault or Fault.from_dict(kwargs)
        if fault.seconds is not None:
            fault.expires_at = time.monotonic() + fault.seconds
        with self._lock:
            self._faults.insert(0, fault)
        return fault

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def take_fault(self, endpoint: str, participant: str = "") -> Fault | None:
        """The fault that applies to this call, consuming one of its `count`."""
        now = time.monotonic()
        with self._lock:
            self._faults = [
                f
                for f in self._faults
                if (f.expires_at is None or f.expires_at > now) and (f.count is None or f.count > 0)
            ]
            for fault in self._faults:
                if fault.matches(endpoint, participant):
                    if fault.count is not None:
                        fault.count -= 1
                    return fault
        return None

    # -- calls --------------------------------------------------------------------------------
    def record(self, call: Call) -> None:
        with self._lock:
            self._calls.append(call)

    def calls(self, endpoint: str | None = None, participant: str | None = None) -> list[Call]:
        with self._lock:
            return [
                c
                for c in self._calls
                if (endpoint is None or c.endpoint == endpoint)
                and (participant is None or c.participant == participant)
            ]

    def clear_calls(self) -> None:
        with self._lock:
            self._calls.clear()


async def apply_fault(fault: Fault | None) -> Response | None:
    if fault is None:
        return None
    if fault.delay_seconds:
        await asyncio.sleep(fault.delay_seconds)
    return fault.response()


async def read_json(request: Request) -> Any:
    return json_or_text(await request.body())


def json_or_text(raw: bytes) -> Any:
    """A request body as a double records it: JSON, else text, None when empty."""
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")


def bearer_of(request: Request) -> str | None:
    return bearer_in(request.headers.get("authorization", ""))


def bearer_in(value: str) -> str | None:
    """The token of an `Authorization: Bearer …` header value."""
    scheme, _, token = value.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


class JwksVerifier:
    """Verifies a JWT against a JWKS URL (fetched lazily, refetched once on an unknown key)."""

    def __init__(self, jwks_url: str, audience: str | None = None) -> None:
        self.jwks_url = jwks_url
        self.audience = audience
        self._keys: list[Any] | None = None
        self._lock = threading.Lock()

    def _load(self, force: bool = False) -> list[Any]:
        with self._lock:
            if self._keys is None or force:
                data = httpx.get(self.jwks_url, timeout=5.0).json()
                self._keys = [jwt.PyJWK.from_dict(k) for k in data.get("keys", [])]
            return self._keys

    def verify(self, token: str) -> dict[str, Any]:
        options: Any = {"verify_aud": self.audience is not None, "verify_exp": True}
        for force in (False, True):
            for key in self._load(force):
                try:
                    claims: dict[str, Any] = jwt.decode(
                        token,
                        key.key,
                        algorithms=["ES256", "RS256"],
                        audience=self.audience,
                        options=options,
                    )
                    return claims
                except jwt.InvalidSignatureError:
                    continue
        raise jwt.InvalidSignatureError("no key verifies the token")


def unverified_claims(token: str) -> dict[str, Any]:
    claims: dict[str, Any] = jwt.decode(token, options={"verify_signature": False})
    return claims


def load_config(path: str | Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    data = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the top level must be a mapping")
    return data


def add_common_routes(app: FastAPI, state: DoubleBase, control: Callable[[dict[str, Any]], Any]) -> None:
    """`GET /_calls` and `POST /_control` (the HTTP test controls of a double run as a process)."""

    @app.get("/_calls")
    def list_calls(endpoint: str | None = None, participant: str | None = None) -> list[dict[str, Any]]:
        return [c.as_dict() for c in state.calls(endpoint, participant)]

    @app.post("/_control")
    async def control_route(request: Request) -> Response:
        body = await read_json(request)
        if not isinstance(body, dict) or not isinstance(body.get("action"), str):
            return JSONResponse({"detail": "body must be an object with an 'action'"}, status_code=422)
        try:
            result = control(body)
        except (ValueError, KeyError, TypeError) as exc:
            return JSONResponse({"detail": str(exc)}, status_code=422)
        return JSONResponse(result if result is not None else {"ok": True})


def common_control(state: DoubleBase, body: dict[str, Any]) -> tuple[bool, Any]:
    """Actions every double understands: fault, clear_faults, clear_calls."""
    action = body["action"]
    if action == "fault":
        fault_fields = {k: v for k, v in body.items() if k != "action"}
        state.set_fault(Fault.from_dict(fault_fields))
        return True, None
    if action == "clear_faults":
        state.clear_faults()
        return True, None
    if action == "clear_calls":
        state.clear_calls()
        return True, None
    return False, None


def run_main(name: str, build: Callable[[dict[str, Any]], FastAPI], argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog=f"python -m dataplane_local.doubles.{name}",
        description=f"DEVELOPMENT DOUBLE: {name}. Never deploy it.",
    )
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--config", default=None, help="YAML configuration file")
    args = parser.parse_args(argv)
    app = build(load_config(args.config))
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
