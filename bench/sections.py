"""The five measurements of issue 8, each against the running system and its own floor; the HTTP
ones (1, 2a, 2b) also against the ceiling processes (bench/ceiling.py), all on replica 1."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
import httpx
from aiokafka import AIOKafkaProducer
from common import Report, Stats, UnexpectedAnswer, ms
from harness import Harness
from loadgen import Run, Target
from system import AGREEMENT, DS_DECISION_TTL, INDEX, METERS, TABLE, Bench, bench_pods, owner

from dataplane_contracts.catalogue import load_catalogue
from dataplane_contracts.events import DisclosureRecorded
from dataplane_contracts.plans import Plan
from dataplane_contracts.topics import AUDIT_DISCLOSURES
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
from query_gateway.sql import load_column_types, narrow_query, validate_query
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


async def _floor(bench: Bench, plans: Mapping[str, Sequence[Plan]], sql: str) -> tuple[str, tuple[Any, ...]]:
    """The statement the gateway runs for `sql` under these plans: the gateway's own narrowing and
    page query (query_gateway.sql), so the floor executes exactly the same narrowed SQL."""
    catalogue = load_catalogue(bench.stack.env_overrides["CATALOGUE_PATH"])
    pool = await asyncpg.create_pool(bench.datasets_url, min_size=1, max_size=1)
    try:
        columns = await load_column_types(pool, catalogue)
    finally:
        await pool.close()
    narrowed = narrow_query(validate_query(sql, catalogue), catalogue, plans, columns)
    page_sql, _ = page_and_count(narrowed.sql, len(narrowed.params), narrowed.denied)
    return page_sql, (*narrowed.params, PAGE, 0)


def without_barrier(page_sql: str) -> str:
    """The same page statement with each narrowing's `OFFSET 0` barrier taken out: the shape the
    gateway ran before issue 19, measured beside it so the table shows what the barrier costs.
    Never served; the page's own `OFFSET $n` stays."""
    unfenced = page_sql.replace(" OFFSET 0)", ")")
    if unfenced == page_sql:
        raise UnexpectedAnswer("the narrowed statement carries no barrier")
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
            "disclosure": {  # what the gateway publishes for this request (dataspace.py)
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
        gw = bench.gateways[0]
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
        h.cpu_table("2b, normal path on replica 1", runs, idle)
        h.answers_check("every HTTP run of 2b answered 2xx only", [r for r in runs if "floor" not in r.label])
    finally:
        await pool.close()


async def lookup_miss(bench: Bench, report: Report, sizes: Sizes) -> None:
    """(3) a plan-cache miss of the lookup handler `rec_registry`, through Kafka and the resolver:
    each caller is new, so each first query needs a plan; the second is the warm floor."""
    gw = bench.gateways[0]
    run = uuid.uuid4().hex[:6]
    users = []
    for i in range(sizes.misses):
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
    before = await bench.metric(resolver, "filter_resolver_resolutions_total")
    miss, hit = Stats(), Stats()
    for token in users:
        headers = {"Authorization": f"Bearer {token}"}
        for stats in (miss, hit):
            t0 = time.perf_counter()
            r = _expect(await bench.http.post(f"{gw}/query", json=body, headers=headers))
            stats.latencies.append(time.perf_counter() - t0)
            if [i["pod"] for i in r.json()["items"]] != ["IT001E00000001"]:
                raise UnexpectedAnswer(f"rec_registry plan served {r.json()['items']}")
    resolved = await bench.metric(resolver, "filter_resolver_resolutions_total") - before
    report.check(
        "every miss was resolved by the resolver, every repeat was not",
        resolved == len(users),
        f"{resolved:.0f} resolutions for {len(users)} callers",
    )
    s = "3 lookup-handler cache miss (rec_registry)"
    report.add(s, "miss p50 / p99 ms", f"{ms(miss.p50)} / {ms(miss.p99)}", f"n={miss.n}, sequential")
    report.add(s, "hit (same caller again) p50 / p99 ms", f"{ms(hit.p50)} / {ms(hit.p99)}")
    report.add(s, "miss − hit p50 ms", ms(miss.p50 - hit.p50), "Kafka + resolver + registry + Redis")


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


async def audit_burst(bench: Bench, report: Report, sizes: Sizes) -> None:
    """(5) a burst of disclosures on the topic; the relay delivers them to the ds double."""
    relay = bench.info.service_urls("audit-relay")[0]
    base = await bench.metric(relay, "audit_relay_delivered_total")
    producer = AIOKafkaProducer(
        bootstrap_servers=bench.info.env["KAFKA_BOOTSTRAP_SERVERS"],
        acks="all",
        enable_idempotence=False,
        linger_ms=5,
    )
    await producer.start()
    run = uuid.uuid4().hex[:6]
    try:
        t0 = time.perf_counter()
        futures = []
        for i in range(sizes.burst):
            event = DisclosureRecorded(
                provider_participant=DEMO_PROVIDER,
                consumer_id=DEMO_CONSUMER,
                agreement_id=DEMO_AGREEMENT,
                transfer_id=f"burst-{run}-{i}",
                dataset_id="meter_readings",
                row_count=1,
                authorized_subject_ids=["did:web:alice.example"],
            )
            futures.append(
                await producer.send(
                    AUDIT_DISCLOSURES, event.model_dump_json().encode(), key=DEMO_PROVIDER.encode()
                )
            )
        await asyncio.gather(*futures)
        produced = time.perf_counter() - t0
    finally:
        await producer.stop()
    max_lag = 0.0
    delivered = 0.0
    deadline = time.perf_counter() + (300 if sizes.burst >= 10_000 else 90)
    while time.perf_counter() < deadline:
        delivered = await bench.metric(relay, "audit_relay_delivered_total") - base
        max_lag = max(max_lag, await bench.metric(relay, "audit_relay_consumer_lag"))
        if delivered >= sizes.burst:
            break
        await asyncio.sleep(0.25)
    drained = time.perf_counter() - t0
    s = "5 audit relay burst"
    report.add(s, "events produced (burst)", f"{sizes.burst}", f"in {produced:.2f}s")
    report.add(
        s, "delivered to ds: events/s", f"{delivered / drained:.0f}", f"{delivered:.0f} in {drained:.1f}s"
    )
    report.add(s, "lag after the burst was produced: s", f"{drained - produced:.1f}")
    report.add(s, "max consumer lag observed: records", f"{max_lag:.0f}", "relay metric, 0.25 s polls")
    calls = (await bench.http.get(f"{bench.info.ds_url}/_calls", params={"endpoint": "audit"})).json()
    got = {
        c["body"]["transfer_id"]
        for c in calls
        if isinstance(c.get("body"), dict)
        and str(c["body"].get("transfer_id", "")).startswith(f"burst-{run}-")
    }
    report.check(
        "ds received every event of the burst", len(got) == sizes.burst, f"{len(got)}/{sizes.burst} distinct"
    )
