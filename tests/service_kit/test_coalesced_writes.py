"""The services' HTTP protocol (`dataplane_service_kit.coalesce`): a response's head and body reach
the socket in one write, and nothing is lost, reordered or held past its loop step — over a real
uvicorn server on loopback (keep-alive, `Connection: close`, a streamed answer, a large body) and,
for the write count itself, over a transport that records what it is given."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn

from dataplane_local.infra import free_port, wait_port
from dataplane_local.timeouts import scaled
from dataplane_service_kit.coalesce import CoalescingHttpToolsProtocol, _HeldWrites


class RecordingTransport(asyncio.Transport):
    """What a socket transport is given, call by call."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


async def test_two_writes_of_one_step_reach_the_transport_as_one_after_that_step() -> None:
    inner = RecordingTransport()
    held = _HeldWrites(inner, asyncio.get_running_loop())
    held.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    held.write(memoryview(b"{}"))
    assert inner.writes == []  # still the step that wrote them
    await asyncio.sleep(0)
    assert inner.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"]
    held.write(b"next")
    await asyncio.sleep(0)
    assert inner.writes[1:] == [b"next"]  # a later step's write is a write of its own


async def test_close_sends_what_is_held_first_and_a_closed_peer_gets_nothing() -> None:
    inner = RecordingTransport()
    held = _HeldWrites(inner, asyncio.get_running_loop())
    held.write(b"last words")
    held.close()
    assert inner.writes == [b"last words"] and inner.closed
    held.write(b"after close")
    await asyncio.sleep(0)
    assert inner.writes == [b"last words"]


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    path = scope["path"]
    if path == "/stream":
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]}
        )
        for i in range(50):
            await send({"type": "http.response.body", "body": f"{i};".encode(), "more_body": True})
            if i % 10 == 0:
                await asyncio.sleep(0)
        await send({"type": "http.response.body", "body": b"end"})
        return
    size = int(path.strip("/") or "2")
    body = (b"x" * size) if size != 2 else b"{}"
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    port = free_port()
    config = uvicorn.Config(
        _app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="off",
        http=CoalescingHttpToolsProtocol,
    )
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    try:
        wait_port(port)
        deadline = time.monotonic() + scaled(10)
        while not srv.started and time.monotonic() < deadline:
            time.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        thread.join(scaled(10))


def test_keep_alive_answers_arrive_whole_and_in_order(server: str) -> None:
    with httpx.Client(base_url=server) as client:
        for size in (2, 7, 70_000, 2, 1):
            response = client.get(f"/{size}")
            assert response.status_code == 200
            assert len(response.content) == size
        assert client.get("/stream").text == "".join(f"{i};" for i in range(50)) + "end"


def test_an_answer_on_a_closing_connection_is_sent_before_the_close(server: str) -> None:
    host, port = server.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=scaled(5)) as sock:
        sock.sendall(b"GET /70000 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and len(body) == 70_000
