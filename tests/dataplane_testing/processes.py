"""A service run as a real process on a free loopback port, its output in a log file: started,
waited for, scraped, stopped and killed the same way for every service."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from dataplane_local.infra import free_port, wait_port
from dataplane_local.procs import stop_process
from dataplane_local.timeouts import scaled

from . import metrics
from .polling import wait_for


@dataclass
class ServiceProcess:
    """`argv` run with `env` plus HTTP_HOST/HTTP_PORT (a free port, or the one `start` is given).

    Its output goes to `log_path`: stdout and stderr, or stderr alone with `stdout_to_log=False`
    (stdout discarded); `append=True` keeps what an earlier run on the same log wrote. `start`
    may be called again after `kill` or `stop` (a restart on a new port)."""

    argv: list[str]
    env: dict[str, str]
    log_path: Path
    name: str = "service"
    stdout_to_log: bool = True
    append: bool = False
    ready_timeout: float = 60.0
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, port: int | None = None) -> ServiceProcess:
        self.port = port or free_port()
        env = {**self.env, "HTTP_HOST": "127.0.0.1", "HTTP_PORT": str(self.port)}
        with self.log_path.open("ab" if self.append else "wb") as log:
            self.proc = subprocess.Popen(
                self.argv,
                env=env,
                stdout=log if self.stdout_to_log else subprocess.DEVNULL,
                stderr=log if not self.stdout_to_log else subprocess.STDOUT,
            )
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stderr(self) -> str:
        """The log (a service that writes its log lines to stderr)."""
        return self.log()

    def readyz(self) -> httpx.Response | None:
        """GET /readyz, or None when nothing answers."""
        try:
            return httpx.get(self.url + "/readyz", timeout=2.0)
        except httpx.HTTPError:
            return None

    async def ready(self) -> bool:
        try:
            async with httpx.AsyncClient() as client:
                return (await client.get(self.url + "/readyz", timeout=2)).status_code == 200
        except httpx.HTTPError:
            return False

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Until /readyz answers 200; a RuntimeError with the log's tail if the process exits
        first, an AssertionError if the (scaled) timeout passes."""

        async def ready() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            return await self.ready()

        limit = self.ready_timeout if timeout is None else timeout
        await wait_for(ready, limit, f"{self.name} ready within {scaled(limit)}s (log: {self.log_path})", 0.1)

    def metrics(self) -> str:
        """Its /metrics text."""
        return httpx.get(self.url + "/metrics", timeout=2.0).text

    async def metric(self, name: str) -> float:
        """Every sample of `name` on its /metrics, summed."""
        async with httpx.AsyncClient() as client:
            return metrics.total((await client.get(self.url + "/metrics")).text, name)

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs (a crash)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        """SIGTERM, a clean shutdown given its time, then SIGKILL."""
        if self.proc is not None:
            stop_process(self.proc)


@contextlib.contextmanager
def double_process(module: str, config: dict[str, Any], tmp_path: Path) -> Iterator[str]:
    """A development double (`python -m <module> --port … --config …`) as a process of its own,
    its YAML configuration written to `tmp_path`; yields its base URL, terminates it after."""
    path = tmp_path / "double.yaml"
    path.write_text(yaml.safe_dump(config))
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", module, "--port", str(port), "--config", str(path)])
    try:
        wait_port(port)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)
