"""A keep-alive HTTP/1.1 client for the relay's one kind of request: a small JSON POST whose answer
the relay reads only the status and `Retry-After` of (the body is read to its end and dropped, so
the connection can carry the next post).

Why not a general client: one post per disclosure is the relay's whole job, and aiohttp's
request machinery (URL objects, header multidicts, request and response objects, timers, payload
writers) was a third of the relay's CPU per event, more than building the request and parsing the
answer need. Here a request is one bytes string written to the transport, and llhttp (httptools,
the parser uvicorn serves with) reads the answer. No redirects, cookies, proxies or compression:
the relay wants none of them. TLS for an `https` connector, with the system's trust store."""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from collections.abc import Mapping
from typing import cast
from urllib.parse import urlsplit

import httptools

_FORBIDDEN = ("\r", "\n", "\0")


class Unanswered(Exception):
    """The connection failed or closed before an answer's status line and headers arrived."""


class _Answer:
    """httptools callbacks of one answer: the Retry-After header and the end of the message."""

    def __init__(self) -> None:
        self.retry_after: str | None = None
        self.headers_done = False
        self.complete = False

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"retry-after":
            self.retry_after = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.headers_done = True

    def on_message_complete(self) -> None:
        self.complete = True


class _Connection(asyncio.Protocol):
    """One connection: one request at a time, its answer parsed as the bytes arrive."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = time.monotonic()
        self._waiter: asyncio.Future[tuple[int, str | None, bool]] | None = None
        self._answer = _Answer()
        self._parser = httptools.HttpResponseParser(self._answer)
        self.received = False  # any byte of the current request's answer

    # -- asyncio.Protocol -----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but the same interface
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done():  # nothing was asked: a server speaking out of turn
            self.close()
            return
        self.received = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.close()
            waiter.set_exception(Unanswered(type(exc).__name__))
            return
        answer = self._answer
        if not answer.complete:
            return
        status = self._parser.get_status_code()
        if status < 200:  # an interim answer (100 Continue): the real one follows
            self._answer.retry_after, answer.complete, answer.headers_done = None, False, False
            return
        waiter.set_result((status, answer.retry_after, self._parser.should_keep_alive()))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        if self._answer.headers_done:  # an answer whose body ends with the connection
            waiter.set_result((self._parser.get_status_code(), self._answer.retry_after, False))
        else:
            waiter.set_exception(Unanswered(type(exc).__name__ if exc else "closed"))

    # -- use ------------------------------------------------------------------------------------
    async def exchange(self, request: bytes) -> tuple[int, str | None, bool]:
        """Send the request; its answer's status, Retry-After and whether the connection stays."""
        assert self.transport is not None
        self._answer = _Answer()
        self._parser = httptools.HttpResponseParser(self._answer)
        self.received = False
        self._waiter = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        try:
            return await self._waiter
        finally:
            self._waiter = None

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class Http1Pool:
    """Keep-alive connections to one origin. The caller bounds how many posts run at once (the
    relay's per-connector gate), and so how many connections there are."""

    def __init__(self, base_url: str, *, keepalive_s: float) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("a connector URL must be http(s)://host[:port][/path]")
        self._host = parts.hostname
        self._tls = parts.scheme == "https"
        self._port = parts.port or (443 if self._tls else 80)
        default_port = parts.port is None or parts.port == (443 if self._tls else 80)
        name = f"[{self._host}]" if ":" in self._host else self._host
        self._host_header = name if default_port else f"{name}:{self._port}"
        self._keepalive_s = keepalive_s
        self._ssl = ssl.create_default_context() if self._tls else None
        self._idle: deque[_Connection] = deque()
        self._busy: set[_Connection] = set()

    async def post(self, target: str, body: bytes, headers: Mapping[str, str]) -> tuple[int, str | None]:
        """POST `body` to `target` (path and query); the status and Retry-After of the answer.
        Unanswered (or OSError) when no answer came. A kept connection that fails before any byte
        of the answer (closed by the server while idle) is replaced once: the post is the same,
        and ds dedupes by its Idempotency-Key."""
        request = self._request(target, body, headers)
        conn, reused = await self._acquire()
        try:
            try:
                status, retry_after, keep = await conn.exchange(request)
            except (Unanswered, OSError):
                if not reused or conn.received:
                    raise
                conn.close()
                self._busy.discard(conn)
                conn, reused = await self._connect(), False
                self._busy.add(conn)
                status, retry_after, keep = await conn.exchange(request)
        except BaseException:  # failed, timed out or cancelled mid-exchange: its state is unknown
            conn.close()
            self._busy.discard(conn)
            raise
        self._busy.discard(conn)
        if keep and not conn.closed:
            conn.idle_since = time.monotonic()
            self._idle.append(conn)
        else:
            conn.close()
        return status, retry_after

    def _request(self, target: str, body: bytes, headers: Mapping[str, str]) -> bytes:
        lines = [f"POST {target} HTTP/1.1", f"Host: {self._host_header}", f"Content-Length: {len(body)}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        if any(c in line for line in lines for c in _FORBIDDEN):
            # a line break in a header value would smuggle headers in: refused, never sent
            raise ValueError("a request header holds a line break")
        return "\r\n".join(lines).encode("latin-1") + b"\r\n\r\n" + body

    async def _acquire(self) -> tuple[_Connection, bool]:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()  # the most recently used: the least likely to be closed
            if conn.closed or now - conn.idle_since >= self._keepalive_s:
                conn.close()
                continue
            self._sweep(now)
            self._busy.add(conn)
            return conn, True
        conn = await self._connect()
        self._busy.add(conn)
        return conn, False

    def _sweep(self, now: float) -> None:
        """Close the idle connections kept past the keep-alive (the oldest are at the left)."""
        while self._idle and (self._idle[0].closed or now - self._idle[0].idle_since >= self._keepalive_s):
            self._idle.popleft().close()

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(
            _Connection,
            self._host,
            self._port,
            ssl=self._ssl,
            server_hostname=self._host if self._tls else None,
        )
        return conn

    def close(self) -> None:
        for conn in [*self._idle, *self._busy]:
            conn.close()
        self._idle.clear()
        self._busy.clear()
