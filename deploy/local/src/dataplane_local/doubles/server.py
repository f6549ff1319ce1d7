"""Serve an ASGI app as a real HTTP server on a loopback port, in a background thread."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import uvicorn
from fastapi import FastAPI

from dataplane_local.infra import free_port, wait_port
from dataplane_local.timeouts import scaled


@dataclass
class RunningServer:
    url: str
    port: int
    _server: uvicorn.Server
    _thread: threading.Thread

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(10)


def serve_in_thread(
    app: FastAPI, port: int | None = None, *, tls: tuple[str, str] | None = None, lifespan: bool = True
) -> RunningServer:
    """`tls`: (certificate chain file, key file) to serve HTTPS, as a TLS-terminating double;
    `lifespan=False` serves the app without running its lifespan (nothing it opens is there)."""
    port = port or free_port()
    certfile, keyfile = tls if tls is not None else (None, None)
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="on" if lifespan else "off",
        ssl_certfile=certfile,
        ssl_keyfile=keyfile,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"double-{port}", daemon=True)
    thread.start()
    wait_port(port)
    deadline = time.monotonic() + scaled(10)
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    scheme = "https" if tls is not None else "http"
    return RunningServer(f"{scheme}://127.0.0.1:{port}", port, server, thread)
