"""A keep-alive HTTP/1.1 client for the relay's one kind of request: a small JSON POST whose answer
the relay reads only the status and `Retry-After` of (the body is read to its end and dropped, so
the connection can carry the next post).

Why not a general client: one post per disclosure is the relay's whole job, and aiohttp's
request machinery (URL objects, header multidicts, request and response objects, timers, payload
writers) was a third of the relay's CPU per event, more than building the request and parsing the
answer need. Here a request is one bytes string written to the transport, and llhttp (httptools,
the parser uvicorn serves with) reads the answer. No redirects, cookies or compression: the relay
wants none of them. TLS for an `https` connector on the one outbound trust store
(dataplane_service_kit.outbound_tls). A forward proxy named by HTTPS_PROXY / HTTP_PROXY /
ALL_PROXY, unless NO_PROXY matches the connector's host, is used as httpx uses it: an `https`
connector through a CONNECT tunnel (TLS end to end, the proxy sees only the host and port), an
`http` one by absolute-form requests sent to the proxy (docs/configuration.md, "Trust store and
proxies")."""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from collections.abc import Mapping
from typing import cast
from urllib.parse import urlsplit

import httptools

from dataplane_service_kit.outbound_tls import Proxy, outbound_ssl_context, proxy_for

_FORBIDDEN = ("\r", "\n", "\0")
# a proxy's answer to CONNECT is a status line and a few headers; more than this is not one
_TUNNEL_ANSWER_MAX = 16_384


class Unanswered(Exception):
    """The connection failed or closed before an answer's status line and headers arrived."""


class _Answer:
    """httptools callbacks of one answer: the Retry-After header and the end of the message."""

    def __init__(self) -> None:
        self.retry_after: str | None = None
        self.headers_done = False
        self.complete = False
        self.keep_alive = False
        self.parser: httptools.HttpResponseParser | None = None

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"retry-after":
            self.retry_after = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.headers_done = True

    def on_message_complete(self) -> None:
        self.complete = True
        # read here: once feed_data returns, llhttp has reset for the next message and
        # should_keep_alive() answers False, which closed every connection after one post
        self.keep_alive = self.parser is not None and self.parser.should_keep_alive()


class _Tunnel(asyncio.Protocol):
    """A proxy's answer to CONNECT: its status, once the header block has arrived. The proxy must
    not send more before the client's TLS hello, so bytes past the headers are a broken tunnel."""

    def __init__(self) -> None:
        self.status: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._buffer = b""

    def data_received(self, data: bytes) -> None:
        if self.status.done():
            return
        self._buffer += data
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buffer) > _TUNNEL_ANSWER_MAX:
                self.status.set_exception(Unanswered("proxy answer too long"))
            return
        fields = self._buffer.split(b"\r\n", 1)[0].split(b" ", 2)
        if len(fields) < 2 or not fields[0].startswith(b"HTTP/1.") or not fields[1].isdigit():
            self.status.set_exception(Unanswered("proxy answer unreadable"))
        elif end + 4 != len(self._buffer):
            self.status.set_exception(Unanswered("proxy spoke before the tunnel's TLS"))
        else:
            self.status.set_result(int(fields[1]))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.status.done():
            self.status.set_exception(Unanswered(type(exc).__name__ if exc else "proxy closed"))


class _Connection(asyncio.Protocol):
    """One connection: one request at a time, its answer parsed as the bytes arrive."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = time.monotonic()
        self._waiter: asyncio.Future[tuple[int, str | None, bool]] | None = None
        self._answer = _Answer()
        self._parser = self._answer.parser = httptools.HttpResponseParser(self._answer)
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
        waiter.set_result((status, answer.retry_after, answer.keep_alive))

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
        self._parser = self._answer.parser = httptools.HttpResponseParser(self._answer)
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

    def __init__(self, base_url: str, *, keepalive_s: float, tls: ssl.SSLContext | None = None) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("a connector URL must be http(s)://host[:port][/path]")
        self._host = parts.hostname
        self._tls = parts.scheme == "https"
        self._port = parts.port or (443 if self._tls else 80)
        default_port = parts.port is None or parts.port == (443 if self._tls else 80)
        name = f"[{self._host}]" if ":" in self._host else self._host
        self._host_header = name if default_port else f"{name}:{self._port}"
        self._authority = f"{name}:{self._port}"
        self._keepalive_s = keepalive_s
        self._ssl = (tls or outbound_ssl_context()) if self._tls else None
        # read once per pool, as httpx reads the variables once per client
        self._proxy: Proxy | None = proxy_for(parts.scheme, self._host)
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
        proxy = self._proxy
        if proxy is not None and not self._tls:
            # forwarded by the proxy: the absolute form names the origin (RFC 9112, 3.2.2)
            target = f"http://{self._host_header}{target}"
        lines = [f"POST {target} HTTP/1.1", f"Host: {self._host_header}", f"Content-Length: {len(body)}"]
        if proxy is not None and not self._tls and proxy.authorization:
            lines.append(f"Proxy-Authorization: {proxy.authorization}")
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
        proxy = self._proxy
        if proxy is not None and self._ssl is not None:
            return await self._tunnel(proxy, self._ssl)
        host, port = (proxy.host, proxy.port) if proxy is not None else (self._host, self._port)
        _, conn = await loop.create_connection(
            _Connection,
            host,
            port,
            ssl=self._ssl,
            server_hostname=self._host if self._tls else None,
        )
        return conn

    async def _tunnel(self, proxy: Proxy, tls: ssl.SSLContext) -> _Connection:
        """CONNECT through the proxy, then TLS with the connector over the tunnel: the
        certificate checked is the connector's, for its own host name."""
        loop = asyncio.get_running_loop()
        transport, tunnel = await loop.create_connection(_Tunnel, proxy.host, proxy.port)
        lines = [f"CONNECT {self._authority} HTTP/1.1", f"Host: {self._authority}"]
        if proxy.authorization:
            lines.append(f"Proxy-Authorization: {proxy.authorization}")
        try:
            transport.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
            status = await tunnel.status
            if status != 200:
                raise Unanswered(f"proxy answered {status} to CONNECT")
            conn = _Connection()
            secured = await loop.start_tls(transport, conn, tls, server_hostname=self._host)
        except BaseException:
            transport.close()
            raise
        if secured is None:  # the loop's transport closed under the handshake
            raise Unanswered("closed")
        conn.connection_made(secured)
        return conn

    def close(self) -> None:
        for conn in [*self._idle, *self._busy]:
            conn.close()
        self._idle.clear()
        self._busy.clear()
