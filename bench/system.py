"""The benchmarked system: an embedded PostgreSQL seeded with a 1 000 000-row table (indexed on its
key column), then the whole local stack over it (`Stack.up`: two gateway replicas, one resolver),
with a bench catalogue and a ds agreement whose verdict carries a 100-key `subject_key_match` and
a decision cache ttl (`cache.ttl_seconds`)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import yaml

from dataplane_local import infra, provision
from dataplane_local.demo import DEMO_CONSUMER, StackInfo
from dataplane_local.stack import DEPLOY_LOCAL, PORTS_ENV, Stack

TABLE = "bench_readings"
INDEX = "bench_readings_pod_idx"
ROWS = 1_000_000
PER_POD = 100  # readings per pod: 10 000 pods, clustered by pod on disk like a time-series table
KEYS = 100
AGREEMENT = "agr-bench"
METERS = "bench_meters"  # a copy of the demo's meter_readings, behind a rec_registry person layer
ORG_LAYER = {"handler": "allow_all", "binds": "organization"}
# how long the gateway may reuse ds's decision for agr-bench (`cache.ttl_seconds` of the verdict):
# longer than any run, so a warm run is one whose decision is cached once the gateway caches them
DS_DECISION_TTL = 300


def pod(i: int) -> str:
    return f"P{i:07d}"


def owner(i: int) -> str:
    return f"user-{i:07d}"


def bench_pods() -> list[str]:
    """The 100 consenting pods, spread over the table (every 97th pod)."""
    return [pod(i * 97) for i in range(KEYS)]


def catalogue() -> dict[str, Any]:
    demo: dict[str, Any] = yaml.safe_load((DEPLOY_LOCAL / "catalogue.yaml").read_text())
    demo["datasets"].append(
        {
            "id": TABLE,
            "table": f"public.{TABLE}",
            # open: no group policy (docs/gateway.md), so a plain person token reaches the row filter; an
            # internal dataset needs a row-scoped organization layer and organization claims
            "access_level": "open",
            "expose": True,
            "dataspace_expose": True,
            "row_filters": {
                # normal path: a person reads the rows they own (owner = their sub)
                "person": {"handler": "direct_user_match", "args": {"column": "owner"}, "binds": "person"},
                "organization": ORG_LAYER,
            },
        }
    )
    demo["datasets"].append(
        {
            "id": METERS,
            "table": f"public.{METERS}",
            "access_level": "open",
            "expose": True,
            "dataspace_expose": False,
            "row_filters": {
                # the lookup handler: a person's rows are their meters in the REC registry
                "person": {"handler": "rec_registry", "args": {"column": "pod"}, "binds": "person"},
                "organization": ORG_LAYER,
            },
        }
    )
    return demo


async def seed(admin_url: str) -> float:
    """The 1M-row table with its indexes, analysed; returns the seconds it took (not measured)."""
    t0 = time.perf_counter()
    await provision.provision_postgres(admin_url)
    conn = await asyncpg.connect(provision.with_database(admin_url, provision.DATASETS_DB))
    try:
        await conn.execute(
            f"CREATE TABLE {TABLE} (pod text NOT NULL, owner text NOT NULL,"
            " ts timestamptz NOT NULL, value double precision NOT NULL)"
        )
        await conn.execute(
            f"INSERT INTO {TABLE} (pod, owner, ts, value)"
            " SELECT 'P' || lpad((i / $2)::text, 7, '0'), 'user-' || lpad((i / $2)::text, 7, '0'),"
            "        timestamptz '2026-01-01 00:00:00+00' + make_interval(hours => (i % $2)::int),"
            "        ((i * 7919) % 1000) / 100.0"
            " FROM generate_series(0::bigint, $1::bigint - 1) AS i",
            ROWS,
            PER_POD,
        )
        await conn.execute(f"CREATE INDEX {INDEX} ON {TABLE} (pod)")
        await conn.execute(f"CREATE INDEX bench_readings_owner_idx ON {TABLE} (owner)")
        await conn.execute(f"ANALYZE {TABLE}")
        await conn.execute(f"CREATE TABLE {METERS} AS SELECT * FROM meter_readings")
        await conn.execute(f"GRANT SELECT ON {TABLE}, {METERS} TO {provision.DATASETS_READER}")
    finally:
        await conn.close()
    return time.perf_counter() - t0


@dataclass
class Bench:
    root: Path
    stack: Stack
    info: StackInfo
    http: httpx.AsyncClient
    admin_url: str
    datasets_url: str
    policy: dict[str, Any]
    pg_pid: int  # the postmaster; its backends are its children

    @property
    def gateways(self) -> list[str]:
        return self.info.gateway_urls

    async def ds_control(self, body: dict[str, Any]) -> Any:
        r = await self.http.post(f"{self.info.ds_url}/_control", json=body)
        r.raise_for_status()
        return r.json()

    async def edr_token(self, agreement: str = AGREEMENT) -> str:
        body = await self.ds_control(
            {"action": "mint_edr", "consumer": DEMO_CONSUMER, "agreement": agreement}
        )
        return str(body["token"])

    async def user_token(self, sub: str, username: str | None = None) -> str:
        claims = {"sub": sub, "preferred_username": username or sub}
        r = await self.http.post(f"{self.info.oidc_url}/_mint", json={"claims": claims})
        r.raise_for_status()
        return str(r.json()["token"])

    async def metric(self, url: str, name: str) -> float:
        """Sum of every sample of one metric at `url`/metrics."""
        text = (await self.http.get(f"{url}/metrics")).text
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name) and line[len(name) : len(name) + 1] in (" ", "{"):
                total += float(line.rsplit(" ", 1)[1])
        return total


def bench_policy() -> dict[str, Any]:
    policy: dict[str, Any] = yaml.safe_load((DEPLOY_LOCAL / "ds-policy.yaml").read_text())
    keys = [f"pod:{p}" for p in bench_pods()]
    policy["agreements"][AGREEMENT] = {
        "consumer": DEMO_CONSUMER,
        "cache": {"ttl_seconds": DS_DECISION_TTL},
        "datasets": [
            {
                "dataset_id": TABLE,
                "decision": "allow",
                "row_filter": {
                    "handler": "subject_key_match",
                    "args": {"column": "pod", "key_type": "pod"},
                    "keys": keys,
                    "subject_dids": [f"did:web:subject-{i}.example" for i in range(KEYS)],
                },
                "organizations": ["rec-demo"],
            }
        ],
    }
    return policy


class Environment:
    """Starts and stops everything the bench uses; `async with Environment(...) as bench`."""

    def __init__(self, root: Path, log: Callable[[str], None]) -> None:
        self.root = root
        self.log = log
        self.pg: infra.ServerProcess | None = None
        self.stack: Stack | None = None
        self.http: httpx.AsyncClient | None = None

    async def __aenter__(self) -> Bench:
        try:
            return await self._start()
        except BaseException:
            await self.__aexit__()  # a failed start leaves nothing running either
            raise

    async def _start(self) -> Bench:
        self.root.mkdir(parents=True, exist_ok=True)
        self.pg = await asyncio.to_thread(infra.start_postgres, self.root / "pg")
        self.log(f"seeding {ROWS:,} rows into {TABLE} ...")
        took = await seed(self.pg.url)
        self.log(f"seeded in {took:.1f}s")
        cat = self.root / "catalogue.yaml"
        cat.write_text(yaml.safe_dump(catalogue(), sort_keys=False))
        os.environ["DATAPLANE_DATABASE_URL"] = self.pg.url  # the stack provisions over this server
        # free ports only: a bench beside a developer stack or a test suite must not meet theirs
        os.environ.setdefault(PORTS_ENV, "any")
        # spans recorded but exported nowhere, as before the local stack had its own receiver: a
        # bench of the data plane, not of a span pipeline on the same two cores (bench/README.md)
        # QE-10: the load is one consumer at many connections; its share is counted (the cost is
        # in every figure) at a size the bench's concurrency never reaches (limits.py: the cost)
        overrides = {
            "CATALOGUE_PATH": str(cat),
            "OTEL_TRACES_EXPORTER": "none",
            "QUERY_MAX_CONCURRENT_PER_CONSUMER": "1000",
            "QUERY_MAX_CONCURRENT_PER_CONSUMER_TOTAL": "100000",
        }
        self.stack = Stack(self.root / "stack", log=self.log, env_overrides=overrides)
        rc = await asyncio.to_thread(self.stack.up, False, False, 120.0, 2, 1)
        if rc != 0:
            raise RuntimeError("the stack did not start; see the lines above")
        info = StackInfo.load(self.stack.root)
        limits = httpx.Limits(max_connections=128, max_keepalive_connections=128)
        self.http = httpx.AsyncClient(timeout=60.0, limits=limits)
        bench = Bench(
            root=self.root,
            stack=self.stack,
            info=info,
            http=self.http,
            admin_url=self.pg.url,
            datasets_url=provision.with_database(self.pg.url, provision.DATASETS_DB),
            policy=bench_policy(),
            pg_pid=self.pg.pid,
        )
        await bench.ds_control({"action": "policy", "policy": bench.policy})
        return bench

    async def __aexit__(self, *exc: object) -> None:
        if self.http is not None:
            await self.http.aclose()
        if self.stack is not None:
            await asyncio.to_thread(self.stack.down)
        if self.pg is not None:
            await asyncio.to_thread(self.pg.stop)
        os.environ.pop("DATAPLANE_DATABASE_URL", None)
