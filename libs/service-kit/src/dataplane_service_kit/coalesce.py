"""One socket write per answer: uvicorn's httptools protocol writes a response's head and its body
with two `transport.write` calls, and each is a `send` system call of its own — on loopback about
a tenth of a small answer's CPU in the server process (bench/README.md, "Where the gateway's time
goes"). The protocol below hands uvicorn a transport that keeps the writes of one event-loop step
and passes them to the socket together at the end of that step, so a head and its body leave in
one call. Nothing is held longer than the step that wrote it, nothing is reordered, and a close
sends what is held first."""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class _HeldWrites:
    """A transport that defers the writes of the current loop step to one write at its end. Every
    other attribute is the wrapped transport's."""

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if not self._held:
            self._loop.call_soon(self._flush)
        self._held.append(bytes(data))

    def writelines(self, lines: Any) -> None:
        for data in lines:
            self.write(data)

    def _flush(self) -> None:
        held, self._held = self._held, []
        if not held or self._transport.is_closing():
            return  # the peer left: what it did not read is nobody's, as with a direct write
        self._transport.write(held[0] if len(held) == 1 else b"".join(held))

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class CoalescingHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol over `_HeldWrites` (uvicorn's `http=` takes the class)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_HeldWrites(transport, self.loop))  # type: ignore[arg-type]
