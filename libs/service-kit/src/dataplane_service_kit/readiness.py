"""Readiness probes that ask the dependency itself, not a flag set once at start-up.

A probe's answer is kept for a second or two: kubelet, a load balancer and a person with curl may
all ask at once, and each /readyz must not become one more round trip to a struggling broker."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

from aiokafka.client import AIOKafkaClient

from dataplane_service_kit.logs import get_logger

log = get_logger(__name__)

# short enough that a paused broker turns /readyz 503 well inside the health router's own bound
# (health.READYZ_BOUND_S, 1.5 s) and within the 5 s an operator may expect; long enough for a
# loaded broker to answer
DEFAULT_PROBE_TIMEOUT_S = 1.0
DEFAULT_PROBE_TTL_S = 1.5


class CachedProbe:
    """`await probe()` → bool: the dependency answered `ask` within `timeout_s` (an `ask` that
    returns False answered "down").

    The answer (either way) is reused for `ttl_s`; concurrent callers share the one probe in
    flight. A probe that raises is an answer ("down"), never an error of /readyz."""

    def __init__(
        self,
        ask: Callable[[], Awaitable[object]],
        *,
        timeout_s: float = DEFAULT_PROBE_TIMEOUT_S,
        ttl_s: float = DEFAULT_PROBE_TTL_S,
        name: str = "dependency",
    ) -> None:
        self._ask = ask
        self._timeout = timeout_s
        self._ttl = ttl_s
        self._name = name
        self._answer: tuple[bool, float] | None = None  # (up, monotonic time asked)
        self._inflight: asyncio.Task[bool] | None = None

    def pending(self) -> asyncio.Future[bool]:
        """The answer as a future, never awaited here: the kept answer (done), else the probe in
        flight, started if none is. A caller that must answer within its own bound waits on it
        with `asyncio.wait(..., timeout=)` and leaves it running past that bound: awaiting a
        cancelled probe would wait for its cleanup, which may talk to the hung dependency."""
        answer = self._answer
        if answer is not None and time.monotonic() - answer[1] < self._ttl:
            kept: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
            kept.set_result(answer[0])
            return kept
        if self._inflight is None or self._inflight.done():
            self._inflight = asyncio.create_task(self._probe(), name=f"probe-{self._name}")
        return self._inflight

    async def __call__(self) -> bool:
        # shielded: one caller's cancellation (the router's own bound) must not end the probe
        # the others wait for
        return await asyncio.shield(self.pending())

    async def _probe(self) -> bool:
        asked = time.monotonic()
        try:
            async with asyncio.timeout(self._timeout):
                # a check that answers False is down as much as one that raises
                up = await self._ask() is not False
        except Exception as exc:  # "down" is the answer; the class names no address or secret
            log.info("readiness_probe_failed", dependency=self._name, error=type(exc).__name__)
            up = False
        self._answer = (up, asked)
        return up

    async def aclose(self) -> None:
        if self._inflight is not None and not self._inflight.done():
            self._inflight.cancel()
            with contextlib.suppress(BaseException):
                await self._inflight


class BrokerMetadata:
    """A Kafka client of the probe's own, bootstrapped on first use: a service whose consumer
    belongs to another component (or starts before the broker answers) can still ask the broker
    for its metadata. `fetch()` raises when no broker answers."""

    def __init__(self, bootstrap_servers: str, request_timeout_ms: int = 5_000) -> None:
        self._servers = bootstrap_servers
        self._request_timeout_ms = request_timeout_ms
        self._client: AIOKafkaClient | None = None
        self._lock = asyncio.Lock()

    async def _bootstrapped(self) -> AIOKafkaClient:
        async with self._lock:
            if self._client is None:
                client = AIOKafkaClient(
                    bootstrap_servers=self._servers, request_timeout_ms=self._request_timeout_ms
                )
                try:
                    await client.bootstrap()
                except BaseException:
                    with contextlib.suppress(Exception):
                        await client.close()
                    raise
                self._client = client
            return self._client

    async def fetch(self) -> None:
        client = await self._bootstrapped()
        await client.fetch_all_metadata()

    async def close(self) -> None:
        async with self._lock:
            if self._client is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._client.close(), 5)
                self._client = None
