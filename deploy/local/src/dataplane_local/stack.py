"""The one-command local stack: infrastructure, development doubles and the four services, each a
separate process on loopback, recorded in `.local/pids.json` so `down` leaves nothing running.

Order (deploy/local/README.md): Tansu → topics → PostgreSQL (+ databases, roles, demo
table) → Valkey → doubles (OIDC, ds connector, REC registry, OTLP receiver) → `.local/stack.env` → services
(`signaling-migrate`, `signaling`, `filter-resolver`, `audit-relay`, `query-gateway`), each
awaited on `/readyz`. Tansu is memory-only: if it dies, every topic, offset and group is gone, so
the only safe recovery is `dataplane-local down && dataplane-local up` (`status` says so)."""

from __future__ import annotations

import asyncio
import importlib.metadata
import importlib.util
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from dataplane_local import infra, provision
from dataplane_local.procs import PidFile, ProcRecord, record_alive, stop_all, stop_record

DEPLOY_LOCAL = Path(__file__).resolve().parents[2]  # deploy/local (workspace member, editable)
# (console script, preferred port), in start order; signaling-migrate runs before signaling
SERVICES: list[tuple[str, int]] = [
    ("signaling", 8001),
    ("filter-resolver", 8002),
    ("audit-relay", 8003),
    ("query-gateway", 8000),
]
DOUBLES: list[tuple[str, str, int, str]] = [  # name, module, preferred port, ready path
    ("oidc", "dataplane_local.doubles.oidc_process", 8090, "/.well-known/openid-configuration"),
    ("ds-connector", "dataplane_local.doubles.ds_connector", 8091, "/_participants"),
    ("rec-registry", "dataplane_local.doubles.rec_registry", 8092, "/_calls"),
    # every service exports its spans here; `dataplane-local traces` draws them (TRACES_FILE)
    ("otlp", "dataplane_local.doubles.otlp_receiver", 4318, "/_spans"),
]
TRACES_FILE = Path("traces") / "spans.jsonl"  # under the state directory
SERVICE_CLIENT = ("svc-dataplane", "svc-dataplane-dev-secret")  # development credentials only
CONTROL_PLANE_CLIENT = ("control-plane", "control-plane-dev-secret")
OIDC_AUDIENCE = "dataplane"


class StackError(RuntimeError):
    pass


def default_root() -> Path:
    """`$DATAPLANE_LOCAL_DIR`, else `.local` in the workspace root (found from the cwd)."""
    if env := os.environ.get("DATAPLANE_LOCAL_DIR"):
        return Path(env).resolve()
    here = Path.cwd().resolve()
    for d in [here, *here.parents]:
        py = d / "pyproject.toml"
        if py.exists() and "[tool.uv.workspace]" in py.read_text():
            return d / ".local"
    return here / ".local"


def missing_services(scripts: list[str] | None = None) -> dict[str, str]:
    """Console scripts (default: the services' and `signaling-migrate`) whose module cannot be
    imported yet, with the reason."""
    eps = {ep.name: ep for ep in importlib.metadata.entry_points(group="console_scripts")}
    missing: dict[str, str] = {}
    for name in scripts if scripts is not None else [*(s for s, _ in SERVICES), "signaling-migrate"]:
        ep = eps.get(name)
        if ep is None:
            missing[name] = "console script not installed"
            continue
        try:
            found = importlib.util.find_spec(ep.module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            missing[name] = f"module {ep.module} does not exist yet"
    return missing


# `any`: every port of a stack is a free one the kernel picks (or the one this state directory's
# last `up` recorded), never the preferred ones. Tests and benches set it: two stacks started at
# once (two suites, a bench beside a suite) would each see a preferred port free, then one of them
# would fail to bind it — or check the other's service for readiness and take it as its own
PORTS_ENV = "DATAPLANE_LOCAL_PORTS"


def _pick_port(*wanted: int | None) -> int:
    """The first of `wanted` that is free, else any free one."""
    for port in wanted:
        if port is None:
            continue
        with socket.socket() as s:
            # as the servers bind: a port whose last listener left connections in TIME_WAIT is free
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    return infra.free_port()


def _service_command(name: str) -> list[str]:
    script = Path(sys.executable).parent / name
    if script.exists():
        return [str(script)]
    found = shutil.which(name)
    if found:
        return [found]
    ep = next(e for e in importlib.metadata.entry_points(group="console_scripts") if e.name == name)
    module, _, attr = ep.value.partition(":")
    return [sys.executable, "-c", f"import sys; from {module} import {attr} as m; sys.exit(m())"]


def _ec_key_pem(path: Path) -> str:
    """An EC P-256 private key (PKCS#8 PEM) kept in `path`: created once, then read back."""
    if not path.exists():
        key = ec.generate_private_key(ec.SECP256R1())
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        path.write_bytes(pem)
        path.chmod(0o600)
    return path.read_text()


def _dps_keys(root: Path) -> tuple[str, str]:
    """The pull-token signing key: kept across restarts (DPS: same on every worker, kept)."""
    path = root / "dps-signing-key.pem"
    _ec_key_pem(path)
    private = serialization.load_pem_private_key(path.read_bytes(), password=None)
    public = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return path.read_text(), public.decode()


def _env_line(key: str, value: str) -> str:
    return f"{key}='" + value.replace("'", "'\\''") + "'"


def instance_names(name: str, count: int) -> list[str]:
    """Process names of a service's replicas: `name`, `name-2`, `name-3`, ..."""
    return [name if i == 0 else f"{name}-{i + 1}" for i in range(count)]


class Stack:
    def __init__(
        self,
        root: Path | None = None,
        log: Callable[[str], None] = print,
        env_overrides: dict[str, str] | None = None,
    ) -> None:
        """`env_overrides` replace or add service settings (tests: CATALOGUE_PATH, OTEL_*, ...)."""
        self.root = (root or default_root()).resolve()
        self.env_overrides = dict(env_overrides or {})
        self.replicas = {name: 1 for name, _ in SERVICES}
        self.service_envs: dict[str, dict[str, str]] = {}
        self.pidfile = PidFile(self.root / "pids.json")
        self.env_file = self.root / "stack.env"
        self.info_file = self.root / "stack.json"
        # each process's port, kept across `up`s (a restarted stack answers where it did before)
        self.ports_file = self.root / "ports.json"
        # how each process was started, for `dataplane-local restart NAME`
        self.starts_file = self.root / "starts.json"
        self.logs = self.root / "logs"
        self.log = log
        self.records: list[ProcRecord] = []
        self.service_ports: dict[str, int] = {}
        # how each double was started (command, URL, ready path), so one can be restarted as it was
        self.double_starts: dict[str, tuple[list[str], str, str]] = {}

    # ------------------------------------------------------------------------------------ up
    def up(
        self,
        infra_only: bool = False,
        allow_missing: bool = False,
        ready_timeout: float = 120.0,
        gateways: int = 1,
        resolvers: int = 1,
    ) -> int:
        """Start everything; `gateways` / `resolvers` replicas each run as their own process on
        their own port (each gateway replica reading its own plan-reply partition)."""
        if gateways < 1 or resolvers < 1:
            self.log("--gateways and --resolvers must be at least 1")
            return 1
        self.replicas.update({"query-gateway": gateways, "filter-resolver": resolvers})
        alive = [r for r in self.pidfile.load() if record_alive(r)]
        if alive:
            names = ", ".join(r.name for r in alive)
            self.log(
                f"a stack is already running from {self.root} ({names}); run `dataplane-local down` first"
            )
            return 1
        self.pidfile.remove()
        missing = {} if infra_only else missing_services()
        if missing and not allow_missing:
            for name, why in missing.items():
                self.log(f"service {name}: {why}")
            self.log("refusing to start without them: pass --allow-missing-services, or use --infra-only")
            return 1
        self.root.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        try:
            env = self._start_infra_and_doubles()
            started, skipped = (
                ([], list(missing)) if infra_only else self._start_services(env, missing, ready_timeout)
            )
        except Exception as exc:
            self.log(f"start failed: {exc}")
            self.log("stopping what was started ...")
            left = stop_all(self.records)
            self.pidfile.remove()
            if left:
                self.log(f"could not stop: {', '.join(left)}")
            return 1
        self.log(f"environment: {self.env_file}  (load it with: set -a; . {self.env_file}; set +a)")
        if infra_only:
            self.log("infrastructure and doubles are up (--infra-only: no services started)")
        for name in skipped:
            self.log(f"NOT STARTED: {name} ({missing.get(name, 'infra-only')})")
        if started:
            self.log(f"services ready: {', '.join(started)}")
        self.log("stop everything with: dataplane-local down")
        return 0

    def _keep(self, rec: ProcRecord) -> None:
        self.records.append(rec)
        self.pidfile.save(self.records)

    def _start_infra_and_doubles(self) -> dict[str, str]:
        urls: dict[str, str] = {}
        # 1. the broker, then its topics (Tansu would auto-create them with 4 partitions)
        if bs := os.environ.get("DATAPLANE_KAFKA_BOOTSTRAP"):
            self.log(f"kafka: using {bs} (DATAPLANE_KAFKA_BOOTSTRAP)")
        else:
            srv = infra.start_kafka(self.root / "kafka")
            self._keep(
                ProcRecord.of("kafka", "infra", srv.pid, url=srv.url, log=str(self.root / "kafka/tansu.log"))
            )
            bs = srv.url
            self.log(f"kafka: Tansu on {bs} (pid {srv.pid})")
        created = asyncio.run(provision.create_topics(bs))
        self.log(f"topics: created {', '.join(created) or 'none (all exist)'}")
        urls["kafka"] = bs
        # 2. PostgreSQL with the datasets and flows databases, roles and the demo table
        if pg := os.environ.get("DATAPLANE_DATABASE_URL"):
            self.log("postgres: using DATAPLANE_DATABASE_URL")
        else:
            srv = infra.start_postgres(self.root / "pg")
            stat_group = _leads_group(srv.pid)
            self._keep(
                ProcRecord.of(
                    "postgres", "infra", srv.pid, url=srv.url, group=stat_group, stop_cmd=srv.stop_cmd
                )
            )
            pg = srv.url
            self.log(f"postgres: {pg} (pid {srv.pid})")
        asyncio.run(provision.provision_postgres(pg))
        urls["postgres"] = pg
        # 3. Valkey (maxmemory with volatile-lru: the plan cache bounds itself)
        if rd := os.environ.get("DATAPLANE_REDIS_URL"):
            self.log("redis: using DATAPLANE_REDIS_URL")
        else:
            srv = infra.start_redis(self.root / "redis")
            self._keep(ProcRecord.of("redis", "infra", srv.pid, url=srv.url))
            rd = srv.url
            self.log(f"redis: Valkey on {rd} (pid {srv.pid})")
        urls["redis"] = rd
        # 4. the development doubles
        for name, module, preferred, ready in DOUBLES:
            port = self._port(name, preferred)
            url = f"http://127.0.0.1:{port}"
            config = self._double_config(name, urls)
            cmd = [sys.executable, "-m", module, "--port", str(port), "--config", str(config)]
            self.double_starts[name] = (cmd, url, ready)
            self.start_double(name)
            urls[name] = url
            self.log(f"double {name}: {url}")
        env = self._env(urls)
        self._write_env(env, urls)
        return env

    def _port(self, name: str, preferred: int | None) -> int:
        """The port this process had in the last `up` from this state directory (ports.json)
        when it is free, else the preferred one when free (never with ports `any`), else any
        free one; recorded for the next `up`."""
        book = _read_json(self.ports_file)
        recorded = book.get(name)
        anywhere = os.environ.get(PORTS_ENV, "").strip().lower() == "any"
        port = _pick_port(recorded if isinstance(recorded, int) else None, None if anywhere else preferred)
        book[name] = port
        self.ports_file.write_text(json.dumps(book, indent=2, sort_keys=True))
        return port

    def _remember_start(self, name: str, start: dict[str, Any]) -> None:
        """How `name` was started (kind, cmd, url, ready path, its own env), for `restart`."""
        starts = _read_json(self.starts_file)
        starts[name] = start
        self.starts_file.write_text(json.dumps(starts, indent=2))

    def _double_config(self, name: str, urls: dict[str, str]) -> Path:
        cfg_dir = self.root / "config"
        cfg_dir.mkdir(exist_ok=True)
        certs = f"{urls.get('oidc', '')}/protocol/openid-connect/certs"
        config: dict[str, Any]
        if name == "oidc":
            config = {
                "clients": dict([SERVICE_CLIENT, CONTROL_PLANE_CLIENT]),
                "default_audience": OIDC_AUDIENCE,
            }
        elif name == "ds-connector":
            config = yaml.safe_load((DEPLOY_LOCAL / "ds-policy.yaml").read_text())
            config["service_auth"] = {"jwks_url": certs}  # every /internal call needs a service token
            # the EDR signing key outlives the double's process: a restarted double keeps
            # verifying the tokens it minted before (the gateways keep its key set cached)
            config.setdefault("private_key_pem", _ec_key_pem(self.root / "ds-edr-signing-key.pem"))
        elif name == "otlp":
            store = self.root / TRACES_FILE
            # a new stack starts a new store: `traces` shows this stack's requests, not a previous one's
            for old in (store, store.with_name(store.name + ".1")):
                old.unlink(missing_ok=True)
            config = {"store": str(store)}
        else:
            config = yaml.safe_load((DEPLOY_LOCAL / "rec-registry.yaml").read_text())
            config["jwks_url"] = certs
        path = cfg_dir / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    def _env(self, urls: dict[str, str]) -> dict[str, str]:
        pg = urls["postgres"]
        signing, public = _dps_keys(self.root)
        ports: dict[str, int] = {}
        for name, preferred in SERVICES:
            for i, instance in enumerate(instance_names(name, self.replicas[name])):
                ports[instance] = self._port(instance, preferred if i == 0 else None)
        self.service_ports = ports
        oidc = urls["oidc"]
        env = {
            "KAFKA_BOOTSTRAP_SERVERS": urls["kafka"],
            # Tansu sleeps out each fetch's whole wait and costs CPU per fetch, so each consumer's
            # wait is chosen for its job (docs/configuration.md, "Kafka"; issue 12): the
            # request/reply readers short while requests are in flight (the gateways pause
            # their reply partition when nothing is pending), the resolver long once idle (the
            # first request after a quiet spell waits up to that long), the relay long. The
            # request/reply wait stays 2: 1 measured no faster on this broker and costs more CPU
            # per miss, and at 0 a Tansu consumer receives nothing (bench/README.md, section 3)
            "KAFKA_FETCH_MAX_WAIT_MS": "500",
            "KAFKA_RPC_FETCH_MAX_WAIT_MS": "2",
            "RESOLVER_IDLE_FETCH_MAX_WAIT_MS": "250",
            "KAFKA_BULK_FETCH_MAX_WAIT_MS": "500",
            # signaling wakes its outbox relay after each commit of its own; the poll only picks
            # up what a failed publish left behind, so it need not run twice a second here
            "OUTBOX_POLL_INTERVAL_MS": "2000",
            "KAFKA_ENABLE_IDEMPOTENCE": "false",
            "REDIS_URL": urls["redis"],
            "DATASETS_DATABASE_URL": provision.with_database(
                pg, provision.DATASETS_DB, provision.DATASETS_READER, provision.ROLE_PASSWORD
            ),
            "DATABASE_URL": provision.with_database(pg, provision.FLOWS_DB),
            "DPS_FLOWS_DATABASE_URL": provision.with_database(
                pg, provision.FLOWS_DB, provision.PULL_READER, provision.ROLE_PASSWORD
            ),
            "DPS_PULL_GRANT_ROLE": provision.PULL_READER,
            "CATALOGUE_PATH": str(DEPLOY_LOCAL / "catalogue.yaml"),
            "ROW_FILTERS_CACHE_KEY_SECRET": secrets.token_hex(32),
            "REC_REGISTRY_URL": urls["rec-registry"],
            "EDR_ENABLED": "true",
            "CONNECTOR_INTERNAL_URL": urls["ds-connector"],
            "CONNECTOR_INTERNAL_URLS": "{}",
            "DPS_ENABLED": "true",
            "DPS_DATAPLANE_ID": "dataplane-local",
            "DPS_SIGNALING_URL": f"http://127.0.0.1:{ports['signaling']}",
            "DPS_PUBLIC_URL": f"http://127.0.0.1:{ports['query-gateway']}",
            "DPS_TRANSFER_TYPES": '["HttpData-PULL", "http-pull"]',
            "DPS_LABELS": "[]",
            "DPS_CONTROL_PLANE_CLIENTS": json.dumps([CONTROL_PLANE_CLIENT[0]]),
            "DPS_TOKEN_SIGNING_KEY": signing,
            "DPS_TOKEN_KEY_ID": "dataplane-local-1",
            "DPS_TOKEN_PUBLIC_KEY": public,
            "CELINE_OIDC_BASE_URL": oidc,
            "CELINE_OIDC_JWKS_URI": f"{oidc}/protocol/openid-connect/certs",
            "CELINE_OIDC_AUDIENCE": OIDC_AUDIENCE,
            "CELINE_OIDC_CLIENT_ID": SERVICE_CLIENT[0],
            "CELINE_OIDC_CLIENT_SECRET": SERVICE_CLIENT[1],
            "LOG_LEVEL": "INFO",
            # spans to the stack's own OTLP receiver, batches sent every half second so that
            # `dataplane-local traces` right after a request already shows it
            "OTEL_EXPORTER_OTLP_ENDPOINT": urls["otlp"],
            "OTEL_BSP_SCHEDULE_DELAY": "500",
        }
        return {**env, **self.env_overrides}

    def _write_env(self, env: dict[str, str], urls: dict[str, str]) -> None:
        tools = {
            "DATAPLANE_ADMIN_DATABASE_URL": urls["postgres"],
            "DATAPLANE_OIDC_URL": urls["oidc"],
            "DATAPLANE_DS_CONNECTOR_URL": urls["ds-connector"],
            "DATAPLANE_REC_REGISTRY_URL": urls["rec-registry"],
            "DATAPLANE_OTLP_URL": urls["otlp"],
            "DATAPLANE_CONTROL_PLANE_CLIENT_ID": CONTROL_PLANE_CLIENT[0],
            "DATAPLANE_CONTROL_PLANE_CLIENT_SECRET": CONTROL_PLANE_CLIENT[1],
            **{
                f"DATAPLANE_{name.upper().replace('-', '_')}_URL": f"http://127.0.0.1:{port}"
                for name, port in self.service_ports.items()
            },
        }
        lines = ["# written by `dataplane-local up`; DEVELOPMENT settings only", "# read by the services:"]
        lines += [_env_line(k, v) for k, v in env.items()]
        lines += ["# for tools and tests (not read by the services):"]
        lines += [_env_line(k, v) for k, v in tools.items()]
        self.env_file.write_text("\n".join(lines) + "\n")
        self.env_file.chmod(0o600)
        replicas = {
            name: [f"http://127.0.0.1:{self.service_ports[i]}" for i in instance_names(name, count)]
            for name, count in self.replicas.items()
        }
        info = {"env": env, "tools": tools, "urls": urls, "replicas": replicas}
        self.info_file.write_text(json.dumps(info, indent=2))

    # ------------------------------------------------------------------------------ services
    def _start_services(
        self, env: dict[str, str], missing: dict[str, str], ready_timeout: float
    ) -> tuple[list[str], list[str]]:
        started: list[str] = []
        skipped = [name for name, _ in SERVICES if name in missing]
        base = {**os.environ, **env, "HTTP_HOST": "127.0.0.1"}
        for name, _ in SERVICES:
            if name in missing:
                continue
            instances = instance_names(name, self.replicas[name])
            for i, instance in enumerate(instances):
                proc_env = {**base, "HTTP_PORT": str(self.service_ports[instance])}
                if name == "query-gateway" and len(instances) > 1:
                    # each replica keeps only its own correlation ids: give each its own partition
                    proc_env["PLAN_REPLY_PARTITION"] = str(i)
                self.service_envs[instance] = proc_env
                if name == "signaling":
                    if "signaling-migrate" in missing:
                        raise StackError("signaling-migrate is missing, so signaling cannot start")
                    self._migrate(proc_env)
                self.start_service(instance, ready_timeout)
                started.append(instance)
        return started, skipped

    def start_service(self, instance: str, ready_timeout: float = 120.0) -> str:
        """(Re)start one service process started before by `up` in this object; waits for /readyz."""
        proc_env = self.service_envs[instance]
        script = next(name for name, _ in SERVICES if instance in instance_names(name, self.replicas[name]))
        url = f"http://127.0.0.1:{proc_env['HTTP_PORT']}"
        self.records = [r for r in self.records if not (r.name == instance and not record_alive(r))]
        cmd = _service_command(script)
        own = {k: v for k, v in proc_env.items() if k in _OWN_SETTINGS}  # the rest: stack.json's env
        self._remember_start(
            instance, {"kind": "service", "cmd": cmd, "url": url, "ready": "/readyz", "env": own}
        )
        self._spawn(instance, "service", cmd, url, proc_env)
        _wait_http(f"{url}/readyz", ready_timeout, self.records[-1])
        self.log(f"service {instance}: ready on {url}")
        return url

    def add_instance(self, name: str, env_overrides: dict[str, str], ready_timeout: float = 120.0) -> str:
        """One more replica of service `name` beside those `up` started: their settings with
        `env_overrides`, its own port; started and ready. Returns its instance name."""
        first = instance_names(name, 1)[0]
        count = self.replicas[name] + 1
        instance = instance_names(name, count)[-1]
        port = infra.free_port()
        self.replicas[name] = count
        self.service_ports[instance] = port
        self.service_envs[instance] = {**self.service_envs[first], **env_overrides, "HTTP_PORT": str(port)}
        self.start_service(instance, ready_timeout)
        return instance

    def remove_instance(self, instance: str) -> None:
        """Stop the replica `add_instance` added last and forget it (its name may be reused)."""
        name = next(n for n, _ in SERVICES if instance in instance_names(n, self.replicas[n]))
        if instance != instance_names(name, self.replicas[name])[-1]:
            raise StackError(f"{instance} is not the last replica of {name}")
        self.stop_service(instance)
        self.replicas[name] -= 1
        del self.service_envs[instance], self.service_ports[instance]

    def start_double(self, name: str, ready_timeout: float = 30.0) -> str:
        """(Re)start one development double as `up` started it: same port, same configuration
        file (its runtime state — policy changes, recorded calls, faults — starts afresh)."""
        cmd, url, ready = self.double_starts[name]
        self.records = [r for r in self.records if not (r.name == name and not record_alive(r))]
        self._remember_start(name, {"kind": "double", "cmd": cmd, "url": url, "ready": ready, "env": {}})
        self._spawn(name, "double", cmd, url, dict(os.environ))
        _wait_http(f"{url}{ready}", ready_timeout, self.records[-1])
        return url

    def stop_double(self, name: str) -> None:
        """Stop one double: its address then has no listener (a connection to it is refused)."""
        self.stop_service(name)

    def stop_service(self, instance: str) -> None:
        """Stop one service process (SIGTERM, then SIGKILL), keeping its settings for a restart."""
        for rec in self.records:
            if rec.name == instance and record_alive(rec) and not stop_record(rec):
                raise StackError(f"could not stop {instance} (pid {rec.pid})")

    def _migrate(self, env: dict[str, str]) -> None:
        log = self.logs / "signaling-migrate.log"
        with log.open("ab") as out:
            rc = subprocess.run(
                _service_command("signaling-migrate"),
                env=env,
                stdout=out,
                stderr=out,
                timeout=120,
                check=False,
            ).returncode
        if rc != 0:
            raise StackError(f"signaling-migrate failed (rc {rc}); see {log}")
        self.log("signaling-migrate: done")

    def _spawn(self, name: str, kind: str, cmd: list[str], url: str, env: dict[str, str]) -> None:
        log = self.logs / f"{name}.log"
        with log.open("ab") as out:
            proc = subprocess.Popen(
                cmd,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        proc.returncode = 0  # detached on purpose: `down` stops it by its recorded pid
        self._keep(ProcRecord.of(name, kind, proc.pid, url=url, log=str(log)))

    # ------------------------------------------------------------------------------- restart
    def restart(self, name: str, ready_timeout: float = 120.0) -> int:
        """`dataplane-local restart NAME`: stop one service (or double) of the running stack and
        start it again as `up` started it — same command, port and settings — then wait until it
        is ready. The rest of the stack keeps running."""
        starts = _read_json(self.starts_file)
        self.records = self.pidfile.load()
        if not self.records or name not in starts:
            known = ", ".join(sorted(starts)) or "none (is a stack running? dataplane-local up)"
            self.log(f"no process {name!r} in the stack at {self.root}; known: {known}")
            return 2
        start = starts[name]
        for rec in self.records:
            if rec.name == name and record_alive(rec) and not stop_record(rec):
                self.log(f"could not stop {name} (pid {rec.pid})")
                return 1
        self.records = [r for r in self.records if r.name != name]
        self.pidfile.save(self.records)
        env = dict(os.environ)
        if start["kind"] == "service":
            env.update(_read_json(self.info_file).get("env", {}))
        env.update(start["env"])
        self.logs.mkdir(parents=True, exist_ok=True)
        self._spawn(name, start["kind"], list(start["cmd"]), start["url"], env)
        try:
            _wait_http(f"{start['url']}{start['ready']}", ready_timeout, self.records[-1])
        except StackError as exc:
            self.log(str(exc))
            return 1
        self.log(f"{name}: restarted, ready on {start['url']} (pid {self.records[-1].pid})")
        return 0

    # ---------------------------------------------------------------------------- down/status
    def down(self) -> int:
        records = self.pidfile.load()
        if not records:
            self.log(f"nothing recorded in {self.pidfile.path}; nothing to stop")
            return 0
        left = stop_all(records)
        if left:
            self.log(f"could not stop: {', '.join(left)}")
            return 1
        self.pidfile.remove()
        self.log(f"stopped {len(records)} processes: {', '.join(r.name for r in records)}")
        return 0

    def status(self) -> int:
        records = self.pidfile.load()
        if not records:
            self.log("no local stack recorded (dataplane-local up starts one)")
            return 1
        healthy = True
        for rec in records:
            alive = record_alive(rec)
            state = "running" if alive else "DEAD"
            if alive and rec.kind == "service":
                state = "ready" if _probe(f"{rec.url}/readyz")[0] else "running, NOT READY"
            healthy = healthy and alive
            self.log(f"{rec.kind:8} {rec.name:16} pid {rec.pid:<8} {state:18} {rec.url}")
        if any(r.name == "kafka" and not record_alive(r) for r in records):
            self.log(
                "the broker is down. Tansu keeps everything in memory, so topics, offsets and "
                "groups are gone: restart the whole stack: dataplane-local down && dataplane-local up"
            )
        elif not healthy:
            self.log(
                "some processes died; see .local/logs/, then: dataplane-local down && dataplane-local up"
            )
        return 0 if healthy else 1


# what `start_service` sets per process over stack.json's shared environment
_OWN_SETTINGS = frozenset({"HTTP_HOST", "HTTP_PORT", "PLAN_REPLY_PARTITION"})


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _leads_group(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid
    except ProcessLookupError:
        return False


def _probe(url: str) -> tuple[bool, str]:
    """Ready or not, and what the endpoint last said (its body, or the transport error's class)."""
    try:
        r = httpx.get(url, timeout=2.0)
    except httpx.HTTPError as exc:
        return False, type(exc).__name__
    return r.status_code == 200, f"{r.status_code} {r.text[:300]}"


# lines of a service's log quoted in a start-up failure: a CI run keeps only what the test printed,
# never the stack's temporary directory
LOG_TAIL_LINES = 25


def log_tail(path: str | None, lines: int = LOG_TAIL_LINES) -> str:
    if path is None:
        return "(no log)"
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode(errors="replace")
    except OSError as exc:
        return f"(log unreadable: {type(exc).__name__})"
    return "\n".join(text.splitlines()[-lines:])


def _wait_http(url: str, timeout: float, rec: ProcRecord) -> None:
    deadline = time.monotonic() + timeout
    said = "no answer yet"
    while time.monotonic() < deadline:
        if not record_alive(rec):
            raise StackError(f"{rec.name} exited during start-up; see {rec.log}:\n{log_tail(rec.log)}")
        up, said = _probe(url)
        if up:
            return
        time.sleep(0.2)
    raise StackError(
        f"{rec.name} not ready at {url} within {timeout:.0f}s (last answer: {said}); see {rec.log}:\n"
        + log_tail(rec.log)
    )
