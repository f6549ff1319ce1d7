"""The front door (docs/operations.md, "The front door"): the one ASGI layer every HTTP request of
a service passes, whichever code answers it — a fast path of the service's own, a framework route,
the framework's 404 and 405, a refused body, a fault nobody caught. Once per request, here:

- the headers are read and the request id accepted or assigned (`request_ids.admit`), and the
  answer carries it as `X-Request-ID`;
- the body is bounded (413 `body_too_large`) before anything decodes it;
- the SERVER span is opened in the caller's trace, carrying the request id;
- the duration and the answer are counted under one label set (`http_metrics`): the route template,
  the status and — read from the problem document the answer is — the error code;
- a fault that escaped every handler is answered `500 internal_error` with the request id (a
  refusal that escaped, with its own code).

It is added to each app as its outermost middleware (`install`), so a middleware added after it
sees every request as well, and one added before it sees every request the fast path leaves."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import orjson
from fastapi import FastAPI
from prometheus_client import Counter, Histogram
from starlette.routing import Mount, Route, compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dataplane_contracts.errors import ERROR_CODES
from dataplane_service_kit.errors import (
    PROBLEM_JSON,
    ServiceError,
    error_response,
    problem_response,
    unexpected_response,
)
from dataplane_service_kit.http_metrics import NOT_TIMED, OTHER_CODE, UNMATCHED
from dataplane_service_kit.limits import BodyTooLarge, bounded_body, replayed
from dataplane_service_kit.request_ids import RAW_HEADER, admit
from dataplane_service_kit.telemetry import ServerSpans, answered

# where a route the framework never saw (a service's fast path) names its template for the door
ROUTE_KEY = "dataplane.route"
_PROBLEM = PROBLEM_JSON.encode()
# the framework's own 404 and 405 are problem documents under these codes (errors.py)
_CODES = frozenset((*ERROR_CODES, "not_found", "method_not_allowed"))

Refused = Callable[[Scope], None]


class FrontDoor:
    """Plain ASGI, outermost: see the module's docstring. `templates` are the app's (where a
    request refused before routing finds its route); `refused` sees the scope of each body
    refused as too large (a service's access records)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        spans: ServerSpans,
        templates: Templates | None = None,
        max_body_bytes: int | None = None,
        durations: Histogram | None = None,
        requests: Counter | None = None,
        refused: Refused | None = None,
    ) -> None:
        self.app = app
        self.spans = spans
        self.templates = templates
        self.max_body_bytes = max_body_bytes
        self.durations = durations
        self.requests = requests
        self.refused = refused

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # the lifespan (no request, so no id) and anything else
            await self.app(scope, receive, send)
            return
        incoming = admit(scope)
        rid = incoming.request_id
        rid_value = rid.encode("latin-1")
        status = 500  # what the client gets when nothing was sent at all
        code = ""
        problem = started = False

        async def sending(message: Message) -> None:
            nonlocal status, code, problem, started
            if message["type"] == "http.response.start":
                started = True
                status = message["status"]
                headers = message.get("headers") or []
                has_id = False
                for name, value in headers:
                    lowered = name.lower()
                    if lowered == RAW_HEADER:
                        has_id = True
                    elif lowered == b"content-type":
                        problem = value == _PROBLEM
                if not has_id:
                    message = {**message, "headers": [*headers, (RAW_HEADER, rid_value)]}
            elif problem and not code:
                code = _code_of(message.get("body", b""))
            await send(message)

        if scope["path"] in NOT_TIMED:  # probes and the scrape: an id, no span, no count
            await self._enter(scope, receive, sending, rid, lambda: started)
            return
        method = scope["method"]
        begun = time.perf_counter()
        with self.spans.span(method, incoming.headers, rid) as span:
            stayed = True
            try:
                stayed = await self._enter(scope, receive, sending, rid, lambda: started)
            finally:
                # a client that left before its body was complete got no answer of ours to count
                if stayed:
                    route = self._route_of(scope)
                    answered(span, method, route, status)
                    if self.durations is not None:
                        self.durations.labels(route, str(status)).observe(time.perf_counter() - begun)
                    if self.requests is not None:
                        self.requests.labels(route, str(status), code).inc()

    async def _enter(
        self, scope: Scope, receive: Receive, send: Send, rid: str, started: Callable[[], bool]
    ) -> bool:
        """Answer the request; False when the client went away before its body was complete."""
        try:
            if self.max_body_bytes is not None:
                try:
                    body = await bounded_body(scope, receive, self.max_body_bytes)
                except BodyTooLarge:
                    await self._too_large(scope, receive, send)
                    return True
                if body is None:
                    return False  # nobody to answer
                receive = replayed(body, receive)
            await self.app(scope, receive, send)
        except Exception as exc:
            if started():
                # the answer is on its way: nothing can replace it, the server ends the connection
                raise
            if isinstance(exc, ServiceError):  # a refusal no handler rendered: its own code
                await problem_response(exc.code, exc.status_code, exc.detail, exc.headers)(
                    scope, receive, send
                )
                return True
            await unexpected_response(exc, rid)(scope, receive, send)
        return True

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.refused is not None:
            self.refused(scope)
        detail = f"request body larger than {self.max_body_bytes} bytes"
        await error_response("body_too_large", detail)(scope, receive, send)

    def _route_of(self, scope: Scope) -> str:
        """The template the request was routed to, its full path: a fast path's, the
        framework's, or — for a request refused before routing — the app's template its path
        matches; `unmatched` when there is none."""
        named = scope.get(ROUTE_KEY)
        if isinstance(named, str):
            return named
        route = scope.get("route")
        if isinstance(route, Mount):
            return route.path + "/{path}"
        path = getattr(route, "path_format", None)
        if isinstance(path, str):
            return _full_template(scope["path"], path)
        return self.templates.match(scope["path"]) if self.templates is not None else UNMATCHED


def _full_template(path: str, template: str) -> str:
    """A route's template with the prefixes of the routers that include it: FastAPI's route
    knows only its own part (`/{flow_id}/start` under `/dps` and `/v1/dataflows`), and the
    prefixes are the path's leading segments (literals: the route matched them)."""
    tail = template.count("/")
    segments = path.split("/")
    if tail >= len(segments):
        return template
    return "/".join(segments[: len(segments) - tail]) + template


class Templates:
    """Every route template of an app, full paths: its OpenAPI document's, and the plain routes
    the app serves beside it (`/openapi.json`, a mounted directory), read when first asked (after
    every router is included). What a request the framework did not name a route for — refused
    before routing, or answered by a plain route — is counted under. No match: `unmatched`."""

    def __init__(self, app: FastAPI) -> None:
        self._app = app
        self._compiled: list[tuple[re.Pattern[str], str]] | None = None

    def match(self, path: str) -> str:
        if self._compiled is None:
            self._compiled = self._read()
        for pattern, template in self._compiled:
            if pattern.match(path):
                return template
        return UNMATCHED

    def _read(self) -> list[tuple[re.Pattern[str], str]]:
        compiled = [(compile_path(t)[0], t) for t in self._app.openapi().get("paths", {})]
        for route in self._app.router.routes:
            if isinstance(route, Mount):  # anything under its path
                compiled.append((re.compile(re.escape(route.path) + "/"), route.path + "/{path}"))
            elif isinstance(route, Route):
                compiled.append((route.path_regex, route.path_format))
        return compiled


def _code_of(body: bytes) -> str:
    """The `error` member of a problem document, when it is one of our codes."""
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        return OTHER_CODE
    code = value.get("error") if isinstance(value, dict) else None
    return code if isinstance(code, str) and code in _CODES else OTHER_CODE


def install(
    app: FastAPI,
    spans: ServerSpans | None = None,
    *,
    max_body_bytes: int | None = None,
    durations: Histogram | None = None,
    requests: Counter | None = None,
    refused: Refused | None = None,
) -> None:
    """Add the door as the app's outermost middleware of ours (call it after the others)."""
    app.add_middleware(
        FrontDoor,
        spans=spans or ServerSpans(),
        templates=Templates(app),
        max_body_bytes=max_body_bytes,
        durations=durations,
        requests=requests,
        refused=refused,
    )
