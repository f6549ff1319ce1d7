"""One delivery attempt to ds, sorted into accepted / retry / rejected, and the retry timing.

Retried: connection errors, timeouts, 408, 429, 5xx (and any other non-4xx), and 401/403 — a
credential or configuration problem that an operator can fix without losing the record. Any other
4xx is final: the record goes to the DLQ, never sent again."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import httpx
from opentelemetry import propagate, trace

from audit_relay.health import Health
from dataplane_service_kit.oauth import ClientCredentialsToken as ServiceToken
from dataplane_service_kit.oauth import TokenUnavailable

AUDIT_PATH = "/internal/audit/query"
_tracer = trace.get_tracer("audit_relay")


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
    """Capped exponential backoff with equal jitter (half fixed, half random, so relays that failed
    together do not retry together); never shorter than a (capped) Retry-After."""
    capped = min(max_s, initial_s * (2.0 ** min(attempt, 30)))
    uniform = rng.uniform if rng is not None else random.uniform
    delay = capped / 2 + uniform(0, capped / 2)
    if retry_after_s is not None:
        delay = max(delay, min(retry_after_s, retry_after_max_s))
    return delay


class DsSender:
    def __init__(self, client: httpx.AsyncClient, token: ServiceToken, health: Health) -> None:
        self._client = client
        self._token = token
        self._health = health

    async def post(self, connector: str, event_id: str, body: dict[str, Any]) -> Outcome:
        try:
            bearer = await self._token.get()
        except TokenUnavailable:
            self._health.credentials_failing = True
            return Retry("token")
        if self._token.configured:
            self._health.credentials_failing = False
        headers = {"Idempotency-Key": event_id}
        if bearer is not None:
            headers["Authorization"] = f"Bearer {bearer}"
        url = connector + AUDIT_PATH
        with _tracer.start_as_current_span("audit_relay.post", kind=trace.SpanKind.CLIENT) as span:
            span.set_attribute("http.request.method", "POST")
            span.set_attribute("url.path", AUDIT_PATH)
            propagate.inject(headers)
            started = time.monotonic()
            try:
                response = await self._client.post(url, json=body, headers=headers)
            except httpx.TimeoutException:
                self._health.ds_failing(connector)
                span.set_attribute("error.type", "timeout")
                return Retry("timeout")
            except httpx.HTTPError:
                self._health.ds_failing(connector)
                span.set_attribute("error.type", "connect_error")
                return Retry("connect_error")
            span.set_attribute("http.response.status_code", response.status_code)
            span.set_attribute("audit_relay.duration_s", time.monotonic() - started)
        return self._sort(connector, response, bearer)

    def _sort(self, connector: str, response: httpx.Response, bearer: str | None) -> Outcome:
        status = response.status_code
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
        return Retry(f"http_{status}", parse_retry_after(response.headers.get("retry-after")))
