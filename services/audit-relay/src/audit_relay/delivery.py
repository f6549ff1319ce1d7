"""One delivery attempt to ds, sorted into accepted / retry / rejected, and the retry timing.

Retried: connection errors, timeouts, 408, 429, 5xx (and any other non-4xx), and 401/403 — a
credential or configuration problem that an operator can fix without losing the record. Any other
4xx is final: the record goes to the DLQ, never sent again."""

from __future__ import annotations

import asyncio
import random
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from urllib.parse import urlsplit

from opentelemetry import propagate, trace
from opentelemetry.context import Context

from audit_relay.health import Health
from audit_relay.http1 import Http1Pool, Unanswered
from dataplane_service_kit.backoff import exponential_delay
from dataplane_service_kit.oauth import ClientCredentialsToken as ServiceToken
from dataplane_service_kit.oauth import TokenUnavailable

AUDIT_PATH = "/internal/audit/query"
_tracer = trace.get_tracer("audit_relay")
_POST_ATTRIBUTES = {"http.request.method": "POST", "url.path": AUDIT_PATH}


@dataclass(frozen=True)
class Accepted:
    status: int


@dataclass(frozen=True)
class Retry:
    cause: str  # a metric label: connect_error, timeout, token, http_<status>
    retry_after_s: float | None = None


@dataclass(frozen=True)
class Refused:
    status: int


Outcome = Accepted | Retry | Refused


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date); None if unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def backoff_delay(
    attempt: int,
    *,
    initial_s: float,
    max_s: float,
    retry_after_s: float | None = None,
    retry_after_max_s: float = 300.0,
    rng: random.Random | None = None,
) -> float:
    """Capped exponential backoff with equal jitter (dataplane_service_kit.backoff: relays that
    failed together do not retry together); never shorter than a (capped) Retry-After."""
    delay = exponential_delay(attempt, initial_s=initial_s, max_s=max_s, jitter=True, rng=rng)
    if retry_after_s is not None:
        delay = max(delay, min(retry_after_s, retry_after_max_s))
    return delay


class PostTimedOut(Exception):
    """ds did not answer within AUDIT_RELAY_HTTP_TIMEOUT_S."""


class PostFailed(Exception):
    """No answer from ds: refused connection, reset, protocol error."""


class ConnectorPools:
    """One keep-alive connection pool per connector, with at most `max_in_flight` posts to it at
    once. The gate is taken before a post and held until its answer: a post waiting for a free
    connection must not spend its own timeout waiting, or a busy pool would read as a slow ds.

    The pools are the relay's own HTTP/1.1 client (http1.py): httpx's pool scanned every pooled
    connection on each request, and aiohttp's request machinery was a third of the relay's CPU
    per event. The issuer (a call every few minutes) keeps the service kit's httpx client."""

    # below the usual server keep-alive (uvicorn: 5 s), so the relay closes an idle connection
    # before ds does and a post rarely meets a connection the server has just closed
    KEEPALIVE_S = 4.0

    def __init__(self, *, max_in_flight: int, timeout_s: float, tls: ssl.SSLContext | None = None) -> None:
        self._tls = tls  # one trust store for every pool (dataplane_service_kit.outbound_tls)
        self._max_in_flight = max_in_flight
        self._timeout_s = timeout_s
        self._gates: dict[str, asyncio.Semaphore] = {}
        self._pools: dict[str, Http1Pool] = {}
        self._targets: dict[str, str] = {}

    def gate(self, connector: str) -> asyncio.Semaphore:
        gate = self._gates.get(connector)
        if gate is None:
            gate = self._gates[connector] = asyncio.Semaphore(self._max_in_flight)
        return gate

    def _pool(self, connector: str) -> Http1Pool:
        pool = self._pools.get(connector)
        if pool is None:
            pool = self._pools[connector] = Http1Pool(connector, keepalive_s=self.KEEPALIVE_S, tls=self._tls)
        return pool

    def _target(self, url: str) -> str:
        target = self._targets.get(url)
        if target is None:
            parts = urlsplit(url)
            target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            self._targets[url] = target
        return target

    async def post(
        self, connector: str, url: str, body: bytes, headers: dict[str, str]
    ) -> tuple[int, str | None]:
        """ds's status and Retry-After header."""
        try:
            async with asyncio.timeout(self._timeout_s):
                return await self._pool(connector).post(self._target(url), body, headers)
        except TimeoutError:
            raise PostTimedOut from None
        except (Unanswered, OSError) as exc:
            raise PostFailed(type(exc).__name__) from None

    async def aclose(self) -> None:
        pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.close()


class DsSender:
    def __init__(self, pools: ConnectorPools, token: ServiceToken, health: Health) -> None:
        self._pools = pools
        self._token = token
        self._health = health

    def gate(self, connector: str) -> asyncio.Semaphore:
        return self._pools.gate(connector)

    async def post(
        self,
        connector: str,
        event_id: str,
        body: bytes,
        *,
        parent: Context | None = None,
        attributes: Mapping[str, str | int] | None = None,
    ) -> Outcome:
        """One attempt; `parent` is the event's trace context (its record's headers), `attributes`
        what the span says about the record. The span is the relay's one span per attempt: the
        CLIENT span of the post, whose context ds receives as `traceparent`."""
        try:
            bearer = await self._token.get()
        except TokenUnavailable:
            self._health.credentials_failing = True
            return Retry("token")
        if self._token.configured:
            self._health.credentials_failing = False
        headers = {"Idempotency-Key": event_id, "Content-Type": "application/json"}
        if bearer is not None:
            headers["Authorization"] = f"Bearer {bearer}"
        url = connector + AUDIT_PATH
        with _tracer.start_as_current_span(
            "audit_relay.post", context=parent, kind=trace.SpanKind.CLIENT, attributes=attributes
        ) as span:
            span.set_attributes(_POST_ATTRIBUTES)
            propagate.inject(headers)
            started = time.monotonic()
            try:
                status, retry_after = await self._pools.post(connector, url, body, headers)
            except PostTimedOut:
                self._health.ds_failing(connector)
                span.set_attribute("error.type", "timeout")
                return Retry("timeout")
            except PostFailed:
                self._health.ds_failing(connector)
                span.set_attribute("error.type", "connect_error")
                return Retry("connect_error")
            span.set_attribute("http.response.status_code", status)
            span.set_attribute("audit_relay.duration_s", time.monotonic() - started)
        return self._sort(connector, status, retry_after, bearer)

    def _sort(self, connector: str, status: int, retry_after: str | None, bearer: str | None) -> Outcome:
        if 200 <= status < 300:
            self._health.ds_answered(connector, accepted=True)
            return Accepted(status)
        if status in (401, 403):
            if status == 401:
                self._token.invalidate(bearer)
            self._health.ds_auth_refused(connector)
            return Retry(f"http_{status}")
        if 400 <= status < 500 and status not in (408, 429):
            self._health.ds_answered(connector, accepted=False)
            return Refused(status)
        self._health.ds_failing(connector)
        return Retry(f"http_{status}", parse_retry_after(retry_after))
