"""The five measurements of issue 8, each against the running system and its own floor; the HTTP
ones (1, 2a, 2b) also against the ceiling processes (bench/ceiling.py), all on replica 1."""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
import httpx
from aiokafka import AIOKafkaProducer
from common import Report, Stats, Table, UnexpectedAnswer, ms
from cpu import tree_seconds
from harness import Harness
from loadgen import Run, Target
from system import AGREEMENT, DS_DECISION_TTL, INDEX, METERS, TABLE, Bench, bench_pods, owner

from dataplane_contracts.catalogue import load_catalogue
from dataplane_contracts.events import DisclosureRecorded
from dataplane_contracts.plans import Plan
from dataplane_contracts.topics import AUDIT_DISCLOSURES
from dataplane_local import infra
from dataplane_local.demo import (
    DEMO_AGREEMENT,
    DEMO_CONSUMER,
    DEMO_PROVIDER,
    Wire,
    control_plane_token,
    signal,
    start_pull_flow,
)
from dataplane_local.doubles.ds_connector import DsConnectorDouble
from dataplane_local.procs import record_alive
from query_gateway.sql import load_column_types, narrow_query, validate_query
from query_gateway.sql.leakproof import load_leakproof_operators
from query_gateway.sql.pagination import page_and_count

EDR_SQL = f"SELECT pod, count(*) AS readings, avg(value) AS mean FROM {TABLE} GROUP BY pod ORDER BY pod"
USER_SQL = f"SELECT ts, value FROM {TABLE} ORDER BY ts"
PAGE = 100


@dataclass(frozen=True)
class Sizes:
    seconds: float  # the measured window of each HTTP (and floor) run
    margin: float  # load before and after the window: the run lasts seconds + 2 × margin
    misses: int
    revocations: int
    burst: int

    @classmethod
    def of(cls, quick: bool) -> Sizes:
        return cls(3, 1, 30, 20, 2_000) if quick else cls(10, 2, 150, 100, 10_000)


def _expect(r: httpx.Response, status: int = 200) -> httpx.Response:
    if r.status_code != status:
        raise UnexpectedAnswer(f"{r.request.method} {r.request.url} → {r.status_code}: {r.text[:300]}")
    return r


async def _floor(
    bench: Bench, plans: Mapping[str, Sequence[Plan]], sql: str, *, rule: bool = True
) -> tuple[str, tuple[Any, ...]]:
    """The statement the gateway runs for `sql` under these plans: the gateway's own narrowing and
    page query (query_gateway.sql), with the database's leakproof operators as the gateway reads
    them, so the floor executes exactly the same narrowed SQL. `rule` False: every filtered
    narrowing fenced (the gateway before issue 30), its order carried where the rule carries it."""
    catalogue = load_catalogue(bench.stack.env_overrides["CATALOGUE_PATH"])
    pool = await asyncpg.create_pool(bench.datasets_url, min_size=1, max_size=1)
    try:
        columns = await load_column_types(pool, catalogue)
        operators = await load_leakproof_operators(pool) if rule else frozenset()
    finally:
        await pool.close()
    narrowed = narrow_query(validate_query(sql, catalogue), catalogue, plans, columns, leakproof=operators)
    page_sql, _ = page_and_count(narrowed.sql, len(narrowed.params), narrowed.denied)
    return page_sql, (*narrowed.params, PAGE, 0)


_KEY = r'_dp_rf\."[^"]+"(?: DESC)?(?: NULLS (?:FIRST|LAST))?'
_BARRIER = re.compile(rf"(?: ORDER BY {_KEY}(?:, {_KEY})*)? OFFSET 0\)")


def without_barrier(page_sql: str) -> str:
    """The same page statement with each narrowing's `OFFSET 0` barrier (and the order carried
    inside it) taken out: the unfenced floor, the database's pace for the caller's statement over
    the filtered rows. Served only where the rule finds nothing that can leak; the page's own
    `OFFSET $n` stays."""
    unfenced = _BARRIER.sub(")", page_sql)
    if "OFFSET 0)" in unfenced:
        raise UnexpectedAnswer("a barrier of an unknown form is left in the narrowed statement")
    return unfenced


def _uses_index(plan: Any) -> bool:
    if isinstance(plan, dict):
        if plan.get("Index Name") == INDEX or plan.get("Index Name") == "bench_readings_owner_idx":
            return True
        return any(_uses_index(v) for v in plan.values())
    if isinstance(plan, list):
        return any(_uses_index(v) for v in plan)
    return False


def _ceiling_spec(bench: Bench, page_sql: str, params: tuple[Any, ...]) -> dict[str, Any]:
    """What a ceiling process runs: the floor's statement, over the gateway's own database URL."""
    env = bench.stack.service_envs["query-gateway"]
    return {
        "database_url": env["DATASETS_DATABASE_URL"],
        "sql": page_sql,
        "params": list(params),
        "offset": 0,
        "limit": PAGE,
        "kafka_bootstrap": env["KAFKA_BOOTSTRAP_SERVERS"],
        "kafka_enable_idempotence": env.get("KAFKA_ENABLE_IDEMPOTENCE", "false").lower() == "true",
    }


def _ds_verdict(bench: Bench) -> dict[str, Any]:
    """ds's answer for the bench request, computed by the double's own code from the same policy."""
    double = DsConnectorDouble(bench.policy)
    return double.decide(
        "", {"consumer_did": DEMO_CONSUMER, "agreement_id": AGREEMENT, "dataset_ids": [TABLE]}
    )


async def _same_items(bench: Bench, url: str, body: dict[str, Any], headers: dict[str, str]) -> list[Any]:
    return list(_expect(await bench.http.post(url, json=body, headers=headers)).json()["items"])


async def edr_and_pull(bench: Bench, report: Report, sizes: Sizes, h: Harness) -> None:
    """(1) warm EDR path vs the ceilings and the asyncpg floor; (2a) DPS pull vs EDR. Replica 1."""
    pods = bench_pods()
    plans = {TABLE: [Plan.among("pod", pods, key_type="pod"), Plan.allow_all()]}
    page_sql, params = await _floor(bench, plans, EDR_SQL)
    verdict = _ds_verdict(bench)
    ttl = (verdict.get("cache") or {}).get("ttl_seconds")
    report.check(
        f"ds's verdict for {AGREEMENT} carries cache.ttl_seconds (warm = decision cached)",
        verdict["decision"] == "allow" and isinstance(ttl, int) and ttl >= DS_DECISION_TTL,
        f"decision {verdict['decision']}, cache {verdict.get('cache')}",
    )
    pool = await asyncpg.create_pool(bench.datasets_url, min_size=10, max_size=10)  # the gateway's size
    try:
        explain = json.loads(await pool.fetchval("EXPLAIN (FORMAT JSON) " + page_sql, *params))
        report.check("EXPLAIN of the narrowed statement uses the key index", _uses_index(explain), INDEX)
        gw = bench.gateways[0]  # replica 1 only: its CPU per request is the whole request's
        token = await bench.edr_token()
        edr_headers = {"Authorization": f"Bearer {token}", "Edc-Contract-Agreement-Id": AGREEMENT}
        body = {"sql": EDR_SQL, "limit": PAGE, "skip_count": True}
        raw = json.dumps(body).encode()
        first = await _same_items(bench, f"{gw}/query", body, edr_headers)
        floor_rows = [dict(r) for r in await pool.fetch(page_sql, *params)]
        same = [r["pod"] for r in first] == [r["pod"] for r in floor_rows] == sorted(pods)
        report.check("gateway and floor return the same 100 consenting pods", same, f"{len(floor_rows)} rows")

        wire = Wire(bench.http)
        cp = await control_plane_token(wire, bench.info)
        flow = await start_pull_flow(wire, bench.info, cp, agreement=AGREEMENT, dataset=TABLE)
        pull_headers = {"Authorization": f"Bearer {flow.token}"}

        spec = _ceiling_spec(bench, page_sql, params)
        dataset = verdict["datasets"][0]
        full_spec = {
            **spec,
            "disclosure": {  # what the gateway publishes for this request (pipeline.py)
                "provider_participant": DEMO_PROVIDER,
                "consumer_id": DEMO_CONSUMER,
                "agreement_id": AGREEMENT,
                "transfer_id": None,
                "dataset_id": TABLE,
                "decision_ref": verdict.get("decision_ref"),
                "authorized_subject_ids": list(dataset["row_filter"]["subject_dids"]),
            },
        }

        async def floor() -> None:
            await pool.fetch(page_sql, *params)

        unfenced_sql = without_barrier(page_sql)

        async def floor_unfenced() -> None:
            await pool.fetch(unfenced_sql, *params)

        s1, s2 = "1 warm EDR, 100-key filter, 1M rows", "2a DPS pull vs EDR (same verdict)"
        async with (
            h.ceiling("ceiling-edr", spec) as ceil,
            h.ceiling("ceiling-edr-full", full_spec, True) as full,
        ):
            answers = [await _same_items(bench, f"{u}/query", body, edr_headers) for u in (ceil, full)]
            same_ceiling = answers == [first, first]
            report.check("both ceilings answer the gateway's items", same_ceiling, f"{len(first)} items")
            idle = await h.idle(max(2.0, h.margin * 2))
            runs: list[Run] = []
            for conc in (1, 32):
                # back to back at each concurrency, so all share the machine's state
                edr = await h.http(
                    Target(f"EDR gw-1 c={conc}", f"{gw}/query", raw, edr_headers), conc, disclosures=True
                )
                fw = await h.http(
                    Target(f"full-work ceiling c={conc}", f"{full}/query", raw, edr_headers),
                    conc,
                    disclosures=True,
                )
                ce = await h.http(Target(f"ceiling c={conc}", f"{ceil}/query", raw, edr_headers), conc)
                fl = await h.floor(floor, conc, f"asyncpg floor c={conc}")
                nb = await h.floor(floor_unfenced, conc, f"asyncpg floor without the barrier c={conc}")
                dps = await h.http(
                    Target(f"DPS pull gw-1 c={conc}", f"{gw}/dps/public/query", raw, pull_headers),
                    conc,
                    disclosures=True,
                )
                for r in (edr, fw, ce, fl, nb):
                    h.add_run(s1, r)
                h.ratio(s1, fl, nb)  # what the barrier costs the database (issue 19)
                h.ratio(s1, edr, nb)
                h.ratio(s1, edr, fl)
                h.ratio(s1, edr, ce)
                h.ratio(s1, edr, fw)
                h.ratio(s1, ce, fl)
                if conc == 1:
                    h.added(s1, edr, fl)
                    h.added(s1, edr, fw)
                h.net_cpu_row(s1, [edr, fw, ce], idle)
                h.add_run(s2, dps)
                h.ratio(s2, dps, edr)
                h.ratio(s2, dps, fl)
                if conc == 1:
                    h.added(s2, dps, fl)
                h.net_cpu_row(s2, [dps, edr], idle)
                runs += [edr, fw, ce, fl, nb, dps]
        h.cpu_table("1 and 2a, EDR and DPS pull on replica 1", runs, idle)
        h.answers_check(
            "every HTTP run of 1 and 2a answered 2xx only", [r for r in runs if "floor" not in r.label]
        )
        report.check(
            "the relay delivered every disclosure of those runs to ds",
            not h.undelivered,
            f"not all delivered after: {', '.join(h.undelivered)}" if h.undelivered else "after each run",
        )
    finally:
        await pool.close()


# issue 30: what the barrier's rule keeps, statement by statement, at the database's pace
_EDR_GROUP = "count(*) AS readings, avg({v}value) AS mean"
FENCE_STATEMENTS = {
    "EDR: group by pod, no qual": EDR_SQL,
    "user rows by time, no qual": USER_SQL,
    "a leakproof WHERE (ts >= '…')": f"SELECT pod, {_EDR_GROUP.format(v='')} FROM {TABLE} "
    "WHERE ts >= '2026-01-01 12:00:00+00' GROUP BY pod ORDER BY pod",
    "a join on keys": f"SELECT r.pod, {_EDR_GROUP.format(v='s.')} FROM {TABLE} r JOIN {TABLE} s "
    "ON s.pod = r.pod AND s.ts = r.ts GROUP BY r.pod ORDER BY r.pod",
    "a WHERE that may leak (value * 2)": f"SELECT pod, {_EDR_GROUP.format(v='')} FROM {TABLE} "
    "WHERE value * 2 >= 0 GROUP BY pod ORDER BY pod",
    "a join with a WHERE that may leak": f"SELECT r.pod, {_EDR_GROUP.format(v='s.')} FROM {TABLE} r "
    f"JOIN {TABLE} s ON s.pod = r.pod AND s.ts = r.ts WHERE r.value * 2 >= 0 GROUP BY r.pod ORDER BY r.pod",
}


def _comparable(rows: Sequence[Any]) -> list[tuple[Any, ...]]:
    """Rows as a sorted list, floats to 9 digits: a sum's last bits follow the plan's row order."""
    out = [tuple(round(v, 9) if isinstance(v, float) else v for v in r.values()) for r in rows]
    return sorted(out, key=repr)


def _fence_kind(page_sql: str) -> str:
    if "OFFSET 0)" not in page_sql:
        return "unfenced"
    return "fenced, order carried" if "ORDER BY _dp_rf" in page_sql else "fenced"


async def fence_rule(bench: Bench, report: Report, sizes: Sizes, h: Harness) -> None:
    """(1f) each statement's floor as the gateway narrows it, beside the same statement with every
    barrier (the gateway before issue 30) and with none (the unfenced floor), at c=32. The rows
    of the three are compared first: the rule changes the plan, never the answer."""
    edr_plans = {TABLE: [Plan.among("pod", bench_pods(), key_type="pod"), Plan.allow_all()]}
    user_plans = {TABLE: [Plan.among("owner", [owner(42)], label="user ids"), Plan.allow_all()]}
    pool = await asyncpg.create_pool(bench.datasets_url, min_size=10, max_size=10)
    s = "1f the barrier's rule: database floors, c=32"
    try:
        for name, sql in FENCE_STATEMENTS.items():
            plans = user_plans if sql == USER_SQL else edr_plans
            ruled, params = await _floor(bench, plans, sql)
            every, _ = await _floor(bench, plans, sql, rule=False)
            variants = {
                "as the gateway narrows it": ruled,
                "every barrier": every,
                "no barrier": without_barrier(every),
            }
            answers = [_comparable(await pool.fetch(v, *params)) for v in variants.values()]
            report.check(
                f"{name}: the three narrowings answer the same rows",
                answers[0] == answers[1] == answers[2] and len(answers[0]) > 0,
                f"{len(answers[0])} rows; the rule: {_fence_kind(ruled)}",
            )
            runs: dict[str, Run] = {}
            for label, text in variants.items():

                async def call(text: str = text, params: tuple[Any, ...] = params) -> None:
                    await pool.fetch(text, *params)

                runs[label] = await h.floor(call, 32, f"{name} — {label}")
                h.add_run(s, runs[label])
            report.add(s, f"{name}: the rule", _fence_kind(ruled), "")
            h.ratio(s, runs["as the gateway narrows it"], runs["no barrier"])
            h.ratio(s, runs["every barrier"], runs["no barrier"])
    finally:
        await pool.close()


async def normal_path(bench: Bench, report: Report, sizes: Sizes, h: Harness) -> None:
    """(2b) the normal API path with `direct_user_match` vs its ceiling and asyncpg floor."""
    me = owner(42)
    plans = {TABLE: [Plan.among("owner", [me], label="user ids"), Plan.allow_all()]}
    page_sql, params = await _floor(bench, plans, USER_SQL)
    pool = await asyncpg.create_pool(bench.datasets_url, min_size=10, max_size=10)
    try:
        explain = json.loads(await pool.fetchval("EXPLAIN (FORMAT JSON) " + page_sql, *params))
        report.check(
            "EXPLAIN of the direct_user_match statement uses an index", _uses_index(explain), "owner"
        )
        gw, gw2 = bench.gateways[0], bench.gateways[1]
        headers = {"Authorization": f"Bearer {await bench.user_token(me)}"}
        body = {"sql": USER_SQL, "limit": PAGE, "skip_count": True}
        raw = json.dumps(body).encode()
        got = await _same_items(bench, f"{gw}/query", body, headers)
        report.check("normal path serves the caller's own 100 rows", len(got) == PAGE, f"{len(got)} rows")

        async def floor() -> None:
            await pool.fetch(page_sql, *params)

        unfenced_sql = without_barrier(page_sql)

        async def floor_unfenced() -> None:
            await pool.fetch(unfenced_sql, *params)

        s = "2b normal path, direct_user_match"
        async with h.ceiling("ceiling-normal", _ceiling_spec(bench, page_sql, params)) as ceil:
            ceiling_items = await _same_items(bench, f"{ceil}/query", body, headers)
            report.check(
                "the ceiling answers the gateway's items (normal)", ceiling_items == got, f"{len(got)} items"
            )
            idle = await h.idle(max(2.0, h.margin * 2))
            runs: list[Run] = []
            for conc in (1, 32):
                nr = await h.http(Target(f"normal gw-1 c={conc}", f"{gw}/query", raw, headers), conc)
                ce = await h.http(Target(f"ceiling c={conc}", f"{ceil}/query", raw, headers), conc)
                fl = await h.floor(floor, conc, f"asyncpg floor c={conc}")
                nb = await h.floor(floor_unfenced, conc, f"asyncpg floor without the barrier c={conc}")
                for r in (nr, ce, fl, nb):
                    h.add_run(s, r)
                h.ratio(s, fl, nb)  # what the barrier costs the database (issue 19)
                h.ratio(s, nr, nb)
                h.ratio(s, nr, fl)
                h.ratio(s, nr, ce)
                h.ratio(s, ce, fl)
                if conc == 1:
                    h.added(s, nr, fl)
                    h.added(s, nr, ce)
                h.net_cpu_row(s, [nr, ce], idle)
                runs += [nr, ce, fl, nb]
                if conc == 32:
                    # the same load spread over both replicas, as the chart's Service spreads it:
                    # what the system serves on this box when one process per replica is the
                    # bound (each replica's CPU per request stays in its own column)
                    both = Target(
                        f"normal gw-1+gw-2 c={conc}", f"{gw}/query", raw, headers, also=(f"{gw2}/query",)
                    )
                    nr2 = await h.http(both, conc)
                    h.add_run(s, nr2)
                    h.ratio(s, nr2, fl)
                    h.ratio(s, nr2, nr)
                    runs.append(nr2)
        h.cpu_table("2b, normal path on replica 1 (and on both, last row)", runs, idle)
        h.answers_check("every HTTP run of 2b answered 2xx only", [r for r in runs if "floor" not in r.label])
    finally:
        await pool.close()


async def servers(bench: Bench, report: Report, sizes: Sizes, h: Harness) -> None:
    """(2c) issue 30: the normal path's ceiling under each HTTP server and worker count, side by
    side at c=32 — what a server or more processes per replica could give the gateway here. Each
    group holds a pool of 10 in all (10 // workers per process), as a replica would."""
    me = owner(42)
    plans = {TABLE: [Plan.among("owner", [me], label="user ids"), Plan.allow_all()]}
    page_sql, params = await _floor(bench, plans, USER_SQL)
    headers = {"Authorization": f"Bearer {await bench.user_token(me)}"}
    raw = json.dumps({"sql": USER_SQL, "limit": PAGE, "skip_count": True}).encode()
    pool = await asyncpg.create_pool(bench.datasets_url, min_size=10, max_size=10)

    async def floor() -> None:
        await pool.fetch(page_sql, *params)

    s = "2c HTTP server and workers (normal ceiling, c=32)"
    try:
        runs: list[Run] = []
        idle: dict[str, float] = {}
        for server, workers in (("uvicorn", 1), ("granian", 1), ("uvicorn", 2), ("granian", 2)):
            name = f"ceiling-{server}-{workers}"
            async with h.ceiling(
                name, _ceiling_spec(bench, page_sql, params), False, server, workers
            ) as ceil:
                idle.update(await h.idle(max(2.0, h.margin * 2)))  # this group's own idle rate
                got = await _same_items(bench, f"{ceil}/query", json.loads(raw), headers)
                report.check(f"{name} answers a page", len(got) == PAGE, f"{len(got)} items")
                label = f"{server} {workers} worker{'s' if workers > 1 else ''}"
                runs.append(await h.http(Target(label, f"{ceil}/query", raw, headers), 32))
                h.add_run(s, runs[-1])
        fl = await h.floor(floor, 32, "asyncpg floor c=32")
        h.add_run(s, fl)
        for r in runs[1:]:
            h.ratio(s, r, runs[0])
        for r in runs:
            h.ratio(s, r, fl)
        h.net_cpu_row(s, runs, idle)
        h.answers_check("every HTTP run of 2c answered 2xx only", runs)
    finally:
        await pool.close()


GATEWAY_HOPS = "query_gateway_plan_miss_hop_seconds"
RESOLVER_HOPS = "filter_resolver_hop_seconds"
# a miss's hops in the order they happen: (where, hop, what it is)
MISS_PATH = (
    ("gw", "claim", "gateway: claim check into Redis"),
    ("gw", "request", "gateway: PlanRequest published (acks=all)"),
    ("res", "fetch", "resolver: request produced → fetched"),
    ("res", "claim", "resolver: claim check taken (GETDEL)"),
    ("res", "resolve", "resolver: rec_registry handler (HTTP)"),
    ("res", "store", "resolver: plan into Redis"),
    ("res", "notify", "resolver: early reply copy on the gateway's Redis channel"),
    ("gw", "plan_read", "gateway: plan out of Redis"),
)
# hops beside the path: the Kafka reply is published after the early copy and read only when
# the early copy has not come (docs/row-filters.md, "The reply channel")
BESIDE_PATH = (
    ("gw", "reply", "gateway: request published → reply read (the hops between)"),
    ("res", "reply", "resolver: Kafka reply published (acks=all), after the early copy"),
    ("gw", "reply_fetch", "gateway: Kafka reply produced → fetched, when it answered"),
    ("res", "commit", "resolver: offsets committed (after the reply, off the path)"),
)
REPLIES_READ = "query_gateway_plan_replies_total"
_SAMPLE = re.compile(r"^(\w+?)_(sum|count|bucket)\{([^}]*)\} (\S+)$")


@dataclass
class Hop:
    total: float = 0.0
    count: float = 0.0
    buckets: dict[float, float] | None = None

    def p(self, q: float) -> float:
        """The bucket bound the q-quantile falls under (a histogram gives no finer figure)."""
        for le, n in sorted((self.buckets or {}).items()):
            if n >= q * self.count:
                return le
        return float("nan")


async def _replies_by_copy(bench: Bench, url: str) -> dict[str, float]:
    """The gateway's plan replies that answered, by the copy that came first."""
    text = (await bench.http.get(f"{url}/metrics")).text
    found = re.findall(rf'^{REPLIES_READ}{{via="(\w+)"}} (\S+)$', text, re.MULTILINE)
    return {via: float(value) for via, value in found}


async def _hops(bench: Bench, url: str, name: str) -> dict[str, Hop]:
    """A hop histogram at `url`/metrics: hop → sum, count, cumulative buckets."""
    text = (await bench.http.get(f"{url}/metrics")).text
    hops: dict[str, Hop] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m is None or m.group(1) != name:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(3)))
        hop = hops.setdefault(labels.get("hop", ""), Hop(buckets={}))
        value = float(m.group(4))
        if m.group(2) == "sum":
            hop.total = value
        elif m.group(2) == "count":
            hop.count = value
        elif hop.buckets is not None:
            hop.buckets[float(labels["le"])] = value
    return hops


def _delta(after: dict[str, Hop], before: dict[str, Hop]) -> dict[str, Hop]:
    out = {}
    for name, a in after.items():
        b = before.get(name, Hop(buckets={}))
        buckets = {le: n - (b.buckets or {}).get(le, 0.0) for le, n in (a.buckets or {}).items()}
        out[name] = Hop(a.total - b.total, a.count - b.count, buckets)
    return out


async def lookup_miss(bench: Bench, report: Report, sizes: Sizes) -> None:
    """(3) a plan-cache miss of the lookup handler `rec_registry`, through Kafka and the resolver:
    each caller is new, so each first query needs a plan; the second is the warm floor."""
    gw = bench.gateways[0]
    run = uuid.uuid4().hex[:6]
    users = []
    for i in range(sizes.misses + 1):  # the first is the cold one, reported apart
        name = f"bench-{run}-{i}"
        asset = {"key": f"m-{i}", "asset_type": "meter", "name": "meter", "sensor_id": "IT001E00000001"}
        r = await bench.http.post(
            f"{bench.info.urls['rec-registry']}/_control",
            json={"action": "set_member", "username": name, "assets": [asset], "user_id": f"u-{name}"},
        )
        r.raise_for_status()
        users.append(await bench.user_token(f"u-{name}", name))
    body = {"sql": f"SELECT pod, count(*) AS n FROM {METERS} GROUP BY pod", "skip_count": True}
    resolver = bench.info.service_urls("filter-resolver")[0]

    async def query(token: str) -> float:
        t0 = time.perf_counter()
        r = _expect(
            await bench.http.post(f"{gw}/query", json=body, headers={"Authorization": f"Bearer {token}"})
        )
        took = time.perf_counter() - t0
        if [i["pod"] for i in r.json()["items"]] != ["IT001E00000001"]:
            raise UnexpectedAnswer(f"rec_registry plan served {r.json()['items']}")
        return took

    # the first plan the resolver makes after start-up pays one-time costs (the registry
    # client's first use, the doubles' first key fetch) and the resolver's idle fetch wait
    cold = await query(users.pop(0))
    before = await bench.metric(resolver, "filter_resolver_resolutions_total")

    async def snapshot() -> dict[str, dict[str, Hop]]:
        gw_hops = await _hops(bench, gw, GATEWAY_HOPS)
        return {"gw": gw_hops, "res": await _hops(bench, resolver, RESOLVER_HOPS)}

    first = last = await snapshot()
    via_before = await _replies_by_copy(bench, gw)
    miss, hit = Stats(), Stats()
    per_miss: list[tuple[float, dict[str, dict[str, Hop]]]] = []
    pids = {r.name: r.pid for r in bench.stack.records if record_alive(r)}
    cpu = dict.fromkeys(pids, 0.0)
    for token in users:
        cpu_before = tree_seconds(pids.values())
        took = await query(token)
        cpu_after = tree_seconds(pids.values())
        for name, pid in pids.items():  # each miss's window only: no scrape, no hit in it
            cpu[name] += cpu_after[pid] - cpu_before[pid]
        miss.latencies.append(took)
        # sequential: the histograms' growth over one miss is that miss's own hops (the scrape
        # runs between requests, outside every measured time)
        now = await snapshot()
        per_miss.append((took, {w: _delta(now[w], last[w]) for w in now}))
        last = now
        hit.latencies.append(await query(token))
    resolved = await bench.metric(resolver, "filter_resolver_resolutions_total") - before
    via_after = await _replies_by_copy(bench, gw)
    via = {k: via_after.get(k, 0.0) - via_before.get(k, 0.0) for k in ("redis", "kafka")}
    hops = {w: _delta(last[w], first[w]) for w in last}
    report.check(
        "every miss was resolved by the resolver, every repeat was not",
        resolved == len(users),
        f"{resolved:.0f} resolutions for {len(users)} callers",
    )
    s = "3 lookup-handler cache miss (rec_registry)"
    report.add(s, "miss p50 / p99 ms", f"{ms(miss.p50)} / {ms(miss.p99)}", f"n={miss.n}, sequential")
    report.add(s, "hit (same caller again) p50 / p99 ms", f"{ms(hit.p50)} / {ms(hit.p99)}")
    report.add(s, "miss − hit p50 ms", ms(miss.p50 - hit.p50), "Kafka + resolver + registry + Redis")
    report.add(s, "first miss after start-up ms", ms(cold), "cold, not in the percentiles above")
    report.add(
        s,
        "replies that answered: early copy (Redis) / Kafka",
        f"{via['redis']:.0f} / {via['kafka']:.0f}",
        "the first copy to arrive answers",
    )
    rows, path = [], 0.0
    for where, name, what in MISS_PATH:
        hop = hops[where].get(name, Hop())
        mean = hop.total / hop.count if hop.count else float("nan")
        path += mean if hop.count else 0.0
        rows.append([what, f"{hop.count:.0f}", ms(mean), f"≤ {ms(hop.p(0.5))}", f"≤ {ms(hop.p(0.99))}"])
    rows.append(["sum of the hops' means", "", ms(path), "", ""])
    rows.append(["miss − hit, means", "", ms(miss.mean - hit.mean), "", ""])
    for where, name, what in BESIDE_PATH:
        hop = hops[where].get(name, Hop())
        mean = hop.total / hop.count if hop.count else float("nan")
        rows.append([what, f"{hop.count:.0f}", ms(mean), f"≤ {ms(hop.p(0.5))}", f"≤ {ms(hop.p(0.99))}"])
    report.table(
        Table(
            "3 a miss hop by hop (gw-1 and the resolver's hop histograms over the misses)",
            ["hop", "n", "mean ms", "p50 bucket", "p99 bucket"],
            rows,
            "fetch hops from the record's CreateTime (ms clock: up to 1 ms high); the rest of "
            "miss − hit is the gateway's own work around the request",
        )
    )
    report.table(_slowest_misses(per_miss))
    busy = {name: 1000 * spent / len(users) for name, spent in cpu.items() if spent == spent and spent > 0}
    rows = [[name, f"{v:.2f}"] for name, v in sorted(busy.items(), key=lambda kv: -kv[1])]
    rows.append(["total", f"{sum(busy.values()):.2f}"])
    report.add(s, "CPU per miss, every process of the stack ms", f"{sum(busy.values()):.2f}", "from /proc")
    report.table(
        Table(
            "3 CPU per miss by process (ms; utime+stime over each miss's own window)",
            ["process", "CPU ms per miss"],
            rows,
            "/proc ticks are 10 ms: a figure is a mean over the misses, not one miss's",
        )
    )


def _slowest_misses(per_miss: list[tuple[float, dict[str, dict[str, Hop]]]], n: int = 6) -> Table:
    """The tail, hop by hop: the slowest misses with each hop's own time, so what makes the p99
    is read off, not guessed (issue 12)."""
    rows = []
    for took, hops in sorted(per_miss, key=lambda m: m[0], reverse=True)[:n]:
        cells, path = [], 0.0
        for where, name, _what in MISS_PATH:
            spent = hops[where].get(name, Hop()).total
            path += spent
            cells.append(ms(spent))
        commit = hops["res"].get("commit", Hop()).total
        rows.append([ms(took), *cells, ms(took - path), ms(commit)])
    header = ["miss ms", *(f"{w}:{name}" for w, name, _ in MISS_PATH), "rest", "res:commit"]
    return Table(
        f"3 the {n} slowest misses of {len(per_miss)}, each hop's own time (ms)",
        header,
        rows,
        "rest: the miss's time outside the hops (HTTP, the gateway's own work); res:commit runs "
        "after the reply, beside the next fetch",
    )


IDLE_SECONDS = 30.0  # issue 12's window, in --quick runs too: a shorter one hides slow timers
IDLE_BUDGET_MS_PER_S = 100.0  # issue 12: the idle stack costs at most 10 % of one core


async def _cpu_rates(pids: Mapping[str, int], seconds: float) -> dict[str, float]:
    """CPU ms per second of each process (with its descendants) over `seconds` of doing nothing."""
    before = tree_seconds(pids.values())
    t0 = time.perf_counter()
    await asyncio.sleep(seconds)
    after = tree_seconds(pids.values())
    took = time.perf_counter() - t0
    return {name: 1000 * (after[pid] - before[pid]) / took for name, pid in pids.items()}


async def idle_stack(bench: Bench, report: Report, sizes: Sizes) -> None:
    """(6) an idle stack: every process the stack recorded (services, broker, Valkey, doubles)
    and the bench's PostgreSQL, sampled from /proc over 30 s with no request in flight; then a
    broker of its own with no client at all, to tell the broker's own cost from its clients'."""
    pids = {r.name: r.pid for r in bench.stack.records if record_alive(r)}
    pids["postgres"] = bench.pg_pid
    rates = await _cpu_rates(pids, IDLE_SECONDS)
    total = sum(v for v in rates.values() if v == v)  # nan (a process gone) is left out
    rows = [[name, f"{rate:.1f}", f"{rate / 10:.1f}"] for name, rate in sorted(rates.items())]
    rows.append(["total", f"{total:.1f}", f"{total / 10:.1f}"])
    report.table(
        Table(
            f"Idle stack: CPU per process over {IDLE_SECONDS:.0f}s, no traffic",
            ["process", "CPU ms/s", "% of one core"],
            rows,
            "utime+stime from /proc, each process with its children (PostgreSQL: postmaster and backends)",
        )
    )
    s = "6 idle stack (no traffic)"
    report.add(
        s, "whole stack: CPU ms per second", f"{total:.1f}", f"{len(rates)} processes, {IDLE_SECONDS:.0f}s"
    )
    report.check(
        "the idle stack costs at most 10 % of one core (issue 12)",
        total <= IDLE_BUDGET_MS_PER_S,
        f"{total:.1f} ms/s",
    )
    broker = await asyncio.to_thread(infra.start_kafka, bench.root / "idle-tansu")
    try:
        await asyncio.sleep(1)  # past its start-up
        alone = (await _cpu_rates({"kafka": broker.pid}, IDLE_SECONDS))["kafka"]
    finally:
        await asyncio.to_thread(broker.stop)
    report.add(s, "a Tansu broker with no client: CPU ms per second", f"{alone:.1f}", "its own process")


async def revocation(bench: Bench, report: Report, sizes: Sizes) -> None:
    """(4) from suspend's 200 to the first refused pull, on each gateway replica."""
    wire = Wire(bench.http)
    cp = await control_plane_token(wire, bench.info)
    body = {"sql": "SELECT count(*) AS n FROM meter_readings", "skip_count": True}
    per_replica: dict[str, Stats] = {g: Stats() for g in bench.gateways}
    first_refused = 0

    async def until_refused(gw: str, headers: dict[str, str], t0: float) -> int:
        attempts = 0
        while True:
            attempts += 1
            r = await bench.http.post(f"{gw}/dps/public/query", json=body, headers=headers)
            if r.status_code == 401:
                per_replica[gw].latencies.append(time.perf_counter() - t0)
                return attempts
            _expect(r)
            if attempts > 1000:
                raise UnexpectedAnswer(f"{gw} still serves a suspended flow's token")

    for _ in range(sizes.revocations):
        flow = await start_pull_flow(wire, bench.info, cp, agreement=DEMO_AGREEMENT)
        headers = {"Authorization": f"Bearer {flow.token}"}
        for gw in bench.gateways:  # warm: the token is served on both replicas
            _expect(await bench.http.post(f"{gw}/dps/public/query", json=body, headers=headers))
        _expect(await signal(wire, bench.info, cp, flow.flow_id, "suspend"))
        t0 = time.perf_counter()
        attempts = await asyncio.gather(*(until_refused(gw, headers, t0) for gw in bench.gateways))
        first_refused += sum(1 for a in attempts if a == 1)
    s = "4 revocation: suspend 200 → refused"
    for i, st in enumerate(per_replica.values(), 1):
        report.add(
            s,
            f"replica {i} p50 / p99 / max ms",
            f"{ms(st.p50)} / {ms(st.p99)} / {ms(max(st.latencies))}",
            f"n={st.n}",
        )
    total = sizes.revocations * len(bench.gateways)
    report.check(
        "the first pull after the 200 is refused on every replica",
        first_refused == total,
        f"{first_refused}/{total}",
    )


# ds answers 503 to every audit post for this long in the middle of the outage burst (issue 12)
OUTAGE_SECONDS = 20.0


@dataclass
class _Burst:
    """One burst on the disclosures topic: when each event was handed to the producer (by its
    transfer id), and the relay's delivered counter before it."""

    tag: str
    sent_at: dict[str, float]
    produced_s: float
    started: float


async def _produce_burst(bench: Bench, n: int, tag: str) -> _Burst:
    producer = AIOKafkaProducer(
        bootstrap_servers=bench.info.env["KAFKA_BOOTSTRAP_SERVERS"],
        acks="all",
        enable_idempotence=False,
        linger_ms=5,
    )
    await producer.start()
    sent_at: dict[str, float] = {}
    try:
        t0 = time.perf_counter()
        started = time.time()
        futures = []
        for i in range(n):
            transfer = f"{tag}-{i}"
            event = DisclosureRecorded(
                provider_participant=DEMO_PROVIDER,
                consumer_id=DEMO_CONSUMER,
                agreement_id=DEMO_AGREEMENT,
                transfer_id=transfer,
                dataset_id="meter_readings",
                row_count=1,
                authorized_subject_ids=["did:web:alice.example"],
            )
            sent_at[transfer] = time.time()
            futures.append(
                await producer.send(
                    AUDIT_DISCLOSURES, event.model_dump_json().encode(), key=DEMO_PROVIDER.encode()
                )
            )
        await asyncio.gather(*futures)
        produced = time.perf_counter() - t0
    finally:
        await producer.stop()
    return _Burst(tag, sent_at, produced, started)


async def _delivered(bench: Bench, relay: str, base: float, n: int, limit_s: float) -> tuple[float, float]:
    """Wait until the relay delivered `n` more events than `base` (or the limit): the count
    delivered and the largest consumer lag seen on the way."""
    max_lag = 0.0
    delivered = 0.0
    deadline = time.perf_counter() + limit_s
    while time.perf_counter() < deadline:
        delivered = await bench.metric(relay, "audit_relay_delivered_total") - base
        max_lag = max(max_lag, await bench.metric(relay, "audit_relay_consumer_lag"))
        if delivered >= n:
            break
        await asyncio.sleep(0.25)
    return delivered, max_lag


async def _audit_calls(bench: Bench, tag: str) -> list[dict[str, Any]]:
    """The ds double's audit calls of one burst, in the order it answered them."""
    calls = (await bench.http.get(f"{bench.info.ds_url}/_calls", params={"endpoint": "audit"})).json()
    return [
        c
        for c in calls
        if isinstance(c.get("body"), dict) and str(c["body"].get("transfer_id", "")).startswith(f"{tag}-")
    ]


def _window(bench: Bench) -> int:
    """The relay's per-partition window: its setting in the stack, else its default."""
    from audit_relay.settings import Settings

    name = "AUDIT_RELAY_MAX_IN_FLIGHT_PER_PARTITION"
    if name in bench.info.env:
        return int(bench.info.env[name])
    default = Settings.model_fields["audit_relay_max_in_flight_per_partition"].default
    assert isinstance(default, int)
    return default


def _order_kept(accepted: list[int], window: int) -> bool:
    """The relay's order promise within a partition (services/audit-relay/README.md): an event is
    accepted only after every event `window` or more places before it was."""
    seen: set[int] = set()
    low = 0  # every event before this place has been accepted
    for i in accepted:
        if i - window >= low:
            return False
        seen.add(i)
        while low in seen:
            low += 1
    return True


def _relay_pids(bench: Bench) -> dict[str, int]:
    records = {r.name: r.pid for r in bench.stack.records if record_alive(r)}
    return {"relay": records["audit-relay"], "ds double": records["ds-connector"], "broker": records["kafka"]}


async def audit_burst(bench: Bench, report: Report, sizes: Sizes) -> None:
    """(5) a burst of disclosures on the topic; the relay delivers them to the ds double. Then a
    second burst during which ds answers 503 for OUTAGE_SECONDS."""
    relay = bench.info.service_urls("audit-relay")[0]
    pids = _relay_pids(bench)
    s = "5 audit relay burst"
    base = await bench.metric(relay, "audit_relay_delivered_total")
    cpu_before = tree_seconds(pids.values())
    burst = await _produce_burst(bench, sizes.burst, f"burst-{uuid.uuid4().hex[:6]}")
    limit = 300 if sizes.burst >= 10_000 else 90
    delivered, max_lag = await _delivered(bench, relay, base, sizes.burst, limit)
    drained = time.time() - burst.started
    cpu_after = tree_seconds(pids.values())
    report.add(s, "events produced (burst)", f"{sizes.burst}", f"in {burst.produced_s:.2f}s")
    report.add(
        s, "delivered to ds: events/s", f"{delivered / drained:.0f}", f"{delivered:.0f} in {drained:.1f}s"
    )
    report.add(s, "lag after the burst was produced: s", f"{drained - burst.produced_s:.1f}")
    report.add(s, "max consumer lag observed: records", f"{max_lag:.0f}", "relay metric, 0.25 s polls")
    per_event = {
        name: 1000 * (cpu_after[pid] - cpu_before[pid]) / max(delivered, 1) for name, pid in pids.items()
    }
    report.add(
        s,
        "CPU ms per event: relay / ds double / broker",
        " / ".join(f"{v:.3f}" for v in per_event.values()),
        "utime+stime from /proc over the burst ÷ events delivered (idle included)",
    )
    calls = await _audit_calls(bench, burst.tag)
    accepted = [c for c in calls if c["status"] == 200]
    first: dict[str, float] = {}
    for c in accepted:
        first.setdefault(c["body"]["transfer_id"], c["at"])
    lags = Stats(latencies=[at - burst.sent_at[t] for t, at in first.items()])
    report.add(
        s,
        "lag per event p50 / p99 / max: s",
        f"{lags.p50:.2f} / {lags.p99:.2f} / {max(lags.latencies, default=float('nan')):.2f}",
        "from the producer's send to ds's 200 (the double's clock)",
    )
    report.check(
        "ds received every event of the burst",
        len(first) == sizes.burst,
        f"{len(first)}/{sizes.burst} distinct",
    )
    report.check(
        "no event of the burst posted twice (no fault)",
        len(calls) == len(first),
        f"{len(calls) - len(first)} extra posts",
    )
    await audit_outage(bench, report, sizes, relay)


async def audit_outage(bench: Bench, report: Report, sizes: Sizes, relay: str) -> None:
    """(5b) a burst during which ds answers 503 to every audit post for OUTAGE_SECONDS: nothing
    lost, the order promise kept, and how long after ds returned the relay delivered again."""
    s = "5b audit relay, ds 503 mid-burst"
    base = await bench.metric(relay, "audit_relay_delivered_total")
    burst = await _produce_burst(bench, sizes.burst, f"outage-{uuid.uuid4().hex[:6]}")
    ds = bench.info.ds_url
    fault = {"action": "fault", "endpoint": "audit", "status": 503, "seconds": OUTAGE_SECONDS}
    (await bench.http.post(f"{ds}/_control", json=fault)).raise_for_status()
    returned = time.time() + OUTAGE_SECONDS  # ds answers again from here (the double's clock)
    delivered, _ = await _delivered(bench, relay, base, sizes.burst, OUTAGE_SECONDS + 300)
    done = time.time()
    calls = await _audit_calls(bench, burst.tag)
    accepted = [c for c in calls if c["status"] == 200]
    refused = [c for c in calls if c["status"] == 503]
    after = [c["at"] for c in accepted if c["at"] >= returned]
    before = sum(1 for c in accepted if c["at"] < returned - OUTAGE_SECONDS)
    report.add(s, "events produced (burst)", f"{sizes.burst}", f"in {burst.produced_s:.2f}s")
    report.add(s, "delivered before the outage / refused (503) posts", f"{before} / {len(refused)}")
    report.add(
        s,
        "first delivery after ds returned: s",
        f"{min(after) - returned:.2f}" if after else "none",
        f"ds answered 503 for {OUTAGE_SECONDS:.0f}s",
    )
    drained = f"{done - returned:.1f}"
    report.add(s, "backlog drained after ds returned: s", drained, "relay metric, 0.25 s polls")
    order = {f"{burst.tag}-{i}": i for i in range(sizes.burst)}
    first: dict[str, int] = {}
    for c in accepted:
        first.setdefault(c["body"]["transfer_id"], order[c["body"]["transfer_id"]])
    report.check(
        "ds 503 mid-burst: nothing lost",
        len(first) == sizes.burst and delivered >= sizes.burst,
        f"{len(first)}/{sizes.burst} distinct accepted",
    )
    window = _window(bench)
    report.check(
        "ds 503 mid-burst: order within the relay's window kept (one key, one partition)",
        _order_kept(list(first.values()), window),
        f"window {window}",
    )
