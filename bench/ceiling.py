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

SPEC.json (written by the bench at run time):
`{"database_url", "sql", "params", "offset", "limit", "kafka_bootstrap", "kafka_enable_idempotence",
"disclosure": {DisclosureRecorded fields except row_count}}`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, MutableMapping
from decimal import Decimal
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

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


class Ceiling:
    """The raw ASGI app: lifespan opens the pool (and the producer with --full-work)."""

    def __init__(self, spec: dict[str, Any], full_work: bool) -> None:
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

    async def start(self) -> None:
        import asyncpg

        self.pool = await asyncpg.create_pool(self.spec["database_url"], min_size=1, max_size=10)
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
                await _answer(send, 200, b'{"answered":%d}' % self.answered)
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


async def _answer(send: Send, status: int, payload: bytes) -> None:
    headers = [*_JSON_HEADERS, (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


def server_stack() -> str:
    """What uvicorn's `auto` picks here, as for the gateway."""
    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    http = "httptools" if importlib.util.find_spec("httptools") else "h11"
    return f"uvicorn ({loop}, {http})"


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
    args = parser.parse_args()
    import uvicorn

    app = Ceiling(json.loads(args.spec.read_text()), args.full_work)
    print(f"ceiling on {args.host}:{args.port}, full work: {args.full_work}, {server_stack()}", flush=True)
    # the arguments dataplane_service_kit.serve gives uvicorn for every service
    uvicorn.run(app, host=args.host, port=args.port, log_config=None, access_log=False, lifespan="on")
    return 0


# ------------------------------------------------------------------ the bench's side: the process
class CeilingProcess:
    """One ceiling as a child process of the bench, on a free port; `stop()` ends it."""

    def __init__(self, name: str, root: Path, spec: dict[str, Any], full_work: bool = False) -> None:
        self.name, self.root, self.spec, self.full_work = name, root, spec, full_work
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
        cmd = [sys.executable, str(HERE / "ceiling.py"), "--spec", str(spec_file), "--port", str(port)]
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
