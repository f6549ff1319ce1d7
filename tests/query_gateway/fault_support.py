"""Faults for the issue-18 tests: pause a server process (and its children) with SIGSTOP and
always resume it; poll with a generous deadline; a raw ASGI transport that shows a bare 500."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, Self

import httpx

from dataplane_contracts.errors import ERROR_CODES, STATUS
from dataplane_local.infra import free_port
from dataplane_local.timeouts import scaled


def process_tree(root: int) -> list[int]:
    """`root` and every descendant (PostgreSQL's backends are the postmaster's children)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


@contextlib.contextmanager
def paused(root: int) -> Iterator[None]:
    """SIGSTOP the process tree; SIGCONT it whatever happens inside."""
    pids = process_tree(root)
    try:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        yield
    finally:
        for pid in process_tree(root) + pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


async def until(check: Callable[[], Awaitable[bool]], what: str, deadline_s: float = 30.0) -> None:
    """Poll `check` until it holds; the deadline (scaled) only bounds a hang."""
    end = time.monotonic() + scaled(deadline_s)
    while time.monotonic() < end:
        if await check():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def coded(response: httpx.Response) -> tuple[int, str]:
    """(status, code) of an answer that is a 200 or a coded error; anything else fails here."""
    if response.status_code == 200:
        return 200, "ok"
    assert response.headers.get("content-type") == "application/json", (response.status_code, response.text)
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
