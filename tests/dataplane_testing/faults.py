"""Faults for the issue-18 tests (pausing a process: `dataplane_local.procs.paused`): TCP proxies,
coded answers, and a raw ASGI transport that shows a bare 500."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any, Self

import httpx

from dataplane_contracts.errors import ERROR_CODES, STATUS
from dataplane_local.infra import free_port
from dataplane_local.timeouts import scaled


def coded(response: httpx.Response) -> tuple[int, str]:
    """(status, code) of an answer that is a 200 or a coded error; anything else fails here."""
    if response.status_code == 200:
        return 200, "ok"
    assert response.headers.get("content-type") == "application/problem+json", (
        response.status_code,
        response.text,
    )
    body: dict[str, Any] = response.json()
    code = body.get("error")
    assert code in ERROR_CODES and STATUS[code] == response.status_code, body
    return response.status_code, str(code)


def raw_client(app: Any) -> httpx.AsyncClient:
    """An in-process client that answers an unhandled exception as the server would (a bare
    500), instead of raising it into the test."""
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://gateway", timeout=scaled(60))


class TcpProxy:
    """A TCP proxy on a free local port in front of `upstream_port`; subclasses say what one
    accepted connection does (`_accept`) and start its pumps with `_spawn`, stopped on exit."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = free_port()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    def _spawn(self, pump: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(pump)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Bytes from `reader` to `writer` until either side ends; the writer closed after."""
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


class PipeProxy(TcpProxy):
    """Bytes both ways; leaving it drops every connection and refuses new ones, as a server
    that went away does."""

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        upstream_r, upstream_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        self._spawn(pipe(client_r, upstream_w))
        self._spawn(pipe(upstream_r, client_w))


Answer = tuple[int, dict[str, Any]]


async def timed_readyz(client: httpx.AsyncClient, bound_s: float) -> Answer:
    """One GET /readyz, its wall time asserted within `bound_s`; (status, body)."""
    started = time.monotonic()
    response = await client.get("/readyz")
    elapsed = time.monotonic() - started
    assert elapsed <= bound_s, (elapsed, response.status_code, response.text)
    return response.status_code, response.json()


async def readyz_settles(
    client: httpx.AsyncClient, bound_s: float, expected: Answer, before: Answer, attempts: int = 60
) -> None:
    """Ask /readyz until it answers `expected`, then a few times more: every answer within
    `bound_s`, none but `before` (a kept answer, a probe still in flight) ahead of `expected`
    and none but `expected` after it. Counted in answers, not seconds: the only time asserted
    is each answer's."""
    for _ in range(attempts):
        got = await timed_readyz(client, bound_s)
        if got == expected:
            break
        assert got == before, got
        await asyncio.sleep(0.2)  # spacing between asks, not a limit
    else:
        raise AssertionError(f"/readyz never answered {expected} in {attempts} asks")
    for _ in range(3):
        assert await timed_readyz(client, bound_s) == expected
