"""The bench's ceiling: the least an HTTP process can do to answer the gateway's request.

    python bench/ceiling.py --spec SPEC.json --port PORT [--full-work]   (CEILING_FULL_WORK=1 too)

A plain ASGI callable (no framework, no middleware) served like the gateway (`uvicorn.run` with the
same arguments as `dataplane_service_kit.serve`: uvloop and httptools when installed, no access
log). Every POST, whatever its path, runs one statement — the narrowed page statement the gateway
runs for the benchmarked request, built by the bench with the gateway's own `query_gateway.sql` —
through an asyncpg pool of 10 (the gateway's size) and answers the gateway's JSON shape
`{"items": [...], "offset", "limit", "count", "total"}`. `GET /readyz` answers 200 once the pool
is open; `GET /_count` gives the POSTs answered so far (`{"answered": N}`, for the bench's window).

`--full-work` adds what the gateway cannot skip on a dataspace request once ds's decision is
cached: one `DisclosureRecorded` per request published to `dataplane.audit.disclosures` and
acknowledged (acks=all, awaited before answering; the gateway's producer settings), so the audit
relay delivers it to ds as it does the gateway's.

`--server granian` serves the same app under granian (a Rust HTTP server, run as `uv run --with
granian==GRANIAN_VERSION`: not a project dependency); `--workers N` runs N processes sharing the port,
each with a pool of 10 // N so the process group holds what one process does. The answered count is
kept in a small shared file (one slot per process), so `GET /_count` is the group's on any worker.

SPEC.json (written by the bench at run time):
`{"database_url", "sql", "params", "offset", "limit", "kafka_bootstrap", "kafka_enable_idempotence",
"disclosure": {DisclosureRecorded fields except row_count}}`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import fcntl
import importlib.util
import json
import mmap
import os
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, MutableMapping
from decimal import Decimal
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
GRANIAN_VERSION = "2.8.9"
SERVERS = ("uvicorn", "granian")
POOL = 10  # the gateway's DATASETS_POOL_MAX_SIZE default: the whole group's
SLOTS = 64  # processes a count file has room for: (pid, answered) as two 8-byte integers each
_SLOT = struct.Struct("<qq")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_JSON_HEADERS = [(b"content-type", b"application/json")]
_TEMPORAL = (dt.datetime, dt.date, dt.time)
_PLAIN = (bool, int, float, str)


def _value(v: object) -> object:
    """A row value as JSON carries it, as the gateway answers it (ISO dates, Decimal → number)."""
    if v is None or isinstance(v, _PLAIN):
        return v
    if isinstance(v, _TEMPORAL):
        return v.isoformat()
    if isinstance(v, Decimal):
        return int(v) if v.is_finite() and v == v.to_integral_value() else float(v)
    return str(v)


class SharedCount:
    """The POSTs a group of processes answered: each process its own slot of one mapped file
    (taken under a lock at start-up), the sum read by any of them."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_RDWR)
        self._map = mmap.mmap(self._fd, SLOTS * _SLOT.size)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            free = next(i for i in range(SLOTS) if _SLOT.unpack_from(self._map, i * _SLOT.size)[0] == 0)
            self._at = free * _SLOT.size
            _SLOT.pack_into(self._map, self._at, os.getpid(), 0)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        self.mine = 0

    @staticmethod
    def create(path: Path) -> None:
        path.write_bytes(bytes(SLOTS * _SLOT.size))

    def add(self) -> None:
        self.mine += 1
        _SLOT.pack_into(self._map, self._at, os.getpid(), self.mine)

    def total(self) -> int:
        return sum(_SLOT.unpack_from(self._map, i * _SLOT.size)[1] for i in range(SLOTS))


class Ceiling:
    """The raw ASGI app: lifespan opens the pool (and the producer with --full-work)."""

    def __init__(
        self, spec: dict[str, Any], full_work: bool, workers: int = 1, count_file: Path | None = None
    ) -> None:
        self.spec = spec
        self.full_work = full_work
        self.sql: str = spec["sql"]
        self.params: tuple[Any, ...] = tuple(spec["params"])
        self.offset = int(spec.get("offset", 0))
        self.limit = int(spec.get("limit", 100))
        self.pool: Any = None
        self.producer: Any = None
        self.disclosure: dict[str, Any] = dict(spec.get("disclosure") or {})
        self.event: Any = None
        self.topic = ""
        self.answered = 0  # POSTs answered, read by the bench through GET /_count
        self.pool_size = max(1, POOL // workers)
        self.count_file = count_file
        self.shared: SharedCount | None = None

    async def start(self) -> None:
        import asyncpg

        if self.count_file is not None:
            self.shared = SharedCount(self.count_file)  # in the worker: its own slot
        self.pool = await asyncpg.create_pool(self.spec["database_url"], min_size=1, max_size=self.pool_size)
        if self.full_work:
            from aiokafka import AIOKafkaProducer

            from dataplane_contracts.events import DisclosureRecorded
            from dataplane_contracts.topics import AUDIT_DISCLOSURES

            self.event, self.topic = DisclosureRecorded, AUDIT_DISCLOSURES

            self.producer = AIOKafkaProducer(
                bootstrap_servers=self.spec["kafka_bootstrap"],
                acks="all",
                enable_idempotence=bool(self.spec.get("kafka_enable_idempotence", False)),
                linger_ms=0,
            )
            await self.producer.start()

    async def stop(self) -> None:
        if self.producer is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.producer.stop(), 10)
        if self.pool is not None:
            await self.pool.close()

    async def _publish(self, row_count: int) -> None:
        # built per request like the gateway's (its own event_id and occurred_at)
        event = self.event(**self.disclosure, row_count=row_count)
        await self.producer.send_and_wait(
            self.topic,
            event.model_dump_json().encode(),
            key=(event.provider_participant or "").encode(),
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.start()
                except Exception as exc:
                    await send({"type": "lifespan.startup.failed", "message": repr(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        if scope["method"] == "GET":
            if scope["path"] == "/readyz":
                await _answer(send, 200, b'{"status":"ready"}')
            elif scope["path"] == "/_count":
                answered = self.shared.total() if self.shared is not None else self.answered
                await _answer(send, 200, b'{"answered":%d}' % answered)
            else:
                await _answer(send, 404, b'{"detail":"not found"}')
            return
        if scope["method"] != "POST":
            await _answer(send, 405, b'{"detail":"POST only"}')
            return
        json.loads(body or b"{}")  # the request as the gateway receives it (not otherwise used)
        rows = await self.pool.fetch(self.sql, *self.params)
        items = [{k: _value(v) for k, v in r.items()} for r in rows]
        if self.producer is not None:
            await self._publish(len(items))
        page = {
            "items": items,
            "offset": self.offset,
            "limit": self.limit,
            "count": len(items),
            "total": None,
        }
        # Starlette's JSONResponse rendering, as the gateway's answer is rendered
        out = json.dumps(page, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":"))
        await _answer(send, 200, out.encode())
        self.answered += 1
        if self.shared is not None:
            self.shared.add()


async def _answer(send: Send, status: int, payload: bytes) -> None:
    headers = [*_JSON_HEADERS, (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


def server_stack() -> str:
    """What uvicorn's `auto` picks here, as for the gateway."""
    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    http = "httptools" if importlib.util.find_spec("httptools") else "h11"
    return f"uvicorn ({loop}, {http})"


def from_env() -> Ceiling:
    """The app as a worker process builds it (uvicorn's and granian's factory)."""
    workers = int(os.environ.get("CEILING_WORKERS", "1"))
    return Ceiling(
        json.loads(Path(os.environ["CEILING_SPEC"]).read_text()),
        os.environ.get("CEILING_FULL_WORK", "") not in ("", "0", "false"),
        workers,
        Path(os.environ["CEILING_COUNT_FILE"]),
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--spec", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument(
        "--full-work",
        action="store_true",
        default=os.environ.get("CEILING_FULL_WORK", "") not in ("", "0", "false"),
        help="also publish one DisclosureRecorded per request (acks=all, awaited)",
    )
    parser.add_argument("--server", choices=SERVERS, default="uvicorn")
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    count_file = args.spec.with_suffix(".count")
    SharedCount.create(count_file)
    os.environ.update(
        CEILING_SPEC=str(args.spec.resolve()),
        CEILING_FULL_WORK="1" if args.full_work else "",
        CEILING_WORKERS=str(args.workers),
        CEILING_COUNT_FILE=str(count_file.resolve()),
    )
    stack = server_stack() if args.server == "uvicorn" else f"granian {GRANIAN_VERSION} (uvloop)"
    print(
        f"ceiling on {args.host}:{args.port}, full work: {args.full_work}, {stack}, {args.workers} worker(s)",
        flush=True,
    )
    if args.server == "granian":
        # granian's own process model: a supervisor and N workers, each building the app
        os.execv(
            sys.executable,
            [
                sys.executable,
                "-m",
                "granian",
                "--interface",
                "asgi",
                "--http",
                "1",
                "--no-ws",
                "--loop",
                "uvloop",
                "--workers",
                str(args.workers),
                "--factory",
                "--working-dir",
                str(HERE),
                "--host",
                args.host,
                "--port",
                str(args.port),
                "--log-level",
                "warning",
                "--no-access-log",
                "ceiling:from_env",
            ],
        )
    import uvicorn

    # the arguments dataplane_service_kit.serve gives uvicorn for every service
    if args.workers == 1:
        uvicorn.run(
            from_env(), host=args.host, port=args.port, log_config=None, access_log=False, lifespan="on"
        )
    else:
        uvicorn.run(
            "ceiling:from_env",
            factory=True,
            app_dir=str(HERE),
            workers=args.workers,
            host=args.host,
            port=args.port,
            log_config=None,
            access_log=False,
            lifespan="on",
        )
    return 0


# ------------------------------------------------------------------ the bench's side: the process
class CeilingProcess:
    """One ceiling as a child process of the bench, on a free port; `stop()` ends it."""

    def __init__(
        self,
        name: str,
        root: Path,
        spec: dict[str, Any],
        full_work: bool = False,
        server: str = "uvicorn",
        workers: int = 1,
    ) -> None:
        self.name, self.root, self.spec, self.full_work = name, root, spec, full_work
        self.server, self.workers = server, workers
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.log = root / f"{name}.log"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, port: int, timeout: float = 60.0) -> str:
        import httpx

        self.root.mkdir(parents=True, exist_ok=True)
        spec_file = self.root / f"{self.name}.json"
        spec_file.write_text(json.dumps(self.spec))
        spec_file.chmod(0o600)
        python = [sys.executable]
        if self.server == "granian":  # the project's environment with granian beside it
            python = ["uv", "run", "--no-sync", "--with", f"granian=={GRANIAN_VERSION}", "python"]
        cmd = [*python, str(HERE / "ceiling.py"), "--spec", str(spec_file), "--port", str(port)]
        cmd += ["--server", self.server, "--workers", str(self.workers)]
        if self.full_work:
            cmd.append("--full-work")
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ceiling {self.name} exited during start-up; see {self.log}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1.0).status_code == 200:
                    return self.url
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"ceiling {self.name} not ready within {timeout:.0f}s; see {self.log}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


if __name__ == "__main__":
    sys.exit(main())
