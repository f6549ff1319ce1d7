"""Issue 32, milestone 1: `changes_since` sessions on the records route (docs/records.md, "Change
sessions") against real signaling, PostgreSQL, broker and the ds double, on two gateway
replicas. Every answer is checked against the visible set computed in PostgreSQL; a client copy
is kept as a client would (items upserted, tombstones removed)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
import redis.asyncio as aioredis
import yaml

from dataplane_contracts.topics import AUDIT_DISCLOSURES
from dataplane_local.doubles.ds_connector import DsConnectorDouble
from dataplane_service_kit.errors import ServiceError
from dataplane_testing.gateway import CACHE_SECRET, CONSUMER, World, running_gateway
from dataplane_testing.records import CURSOR_SECRET, RecordsWorld, consent_policy, records_world
from dataplane_testing.topics import TopicTail
from query_gateway.app import StartupRefused
from query_gateway.clients.concurrency import KEEP_S, SharedShare
from query_gateway.pipeline import consumer_key
from query_gateway.records.watch import ChangeWatchers
from query_gateway.settings import Settings

CATALOGUE = Path(__file__).parent / "records_changes_catalogue.yaml"
# the change column and the trigger docs/records.md asks of an operator: the writing
# transaction's id on every insert and update, rows leave by the soft-delete column, and the key
# and the row filter's column never change (a change there would move a row out of reach unseen)
SEED = """
CREATE TABLE events (
    id bigint PRIMARY KEY, subject text NOT NULL, amount numeric, memo text,
    changed xid8 NOT NULL DEFAULT pg_current_xact_id(), deleted_at timestamptz,
    loose xid8, unindexed xid8 NOT NULL DEFAULT pg_current_xact_id()
);
CREATE INDEX events_changed ON events (changed);
CREATE FUNCTION events_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'DELETE' THEN
    RAISE EXCEPTION 'events: a row leaves by deleted_at, never by DELETE';
  END IF;
  IF TG_OP = 'UPDATE' AND (NEW.id, NEW.subject) IS DISTINCT FROM (OLD.id, OLD.subject) THEN
    RAISE EXCEPTION 'events: id and subject never change';
  END IF;
  NEW.changed := pg_current_xact_id();
  RETURN NEW;
END $$;
CREATE TRIGGER events_changed BEFORE INSERT OR UPDATE OR DELETE ON events
  FOR EACH ROW EXECUTE FUNCTION events_changed();
CREATE TABLE pairs (
    region text NOT NULL, seq int NOT NULL, subject text NOT NULL, note text,
    changed xid8 NOT NULL DEFAULT pg_current_xact_id(), gone boolean NOT NULL DEFAULT false,
    PRIMARY KEY (region, seq)
);
CREATE INDEX pairs_changed ON pairs (changed);
CREATE FUNCTION pairs_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  NEW.changed := pg_current_xact_id();
  RETURN NEW;
END $$;
CREATE TRIGGER pairs_changed BEFORE INSERT OR UPDATE ON pairs
  FOR EACH ROW EXECUTE FUNCTION pairs_changed();
INSERT INTO pairs (region, seq, subject, note) VALUES
 ('north', 2, 's1', 'n2'), ('north', 10, 's1', 'n10'), ('south', 1, 's1', 's1'), ('south', 3, 's2', 's3');
INSERT INTO events (id, subject, amount, memo) VALUES
 (1, 's1', 1, 'a'), (2, 's1', -1, 'b'), (3, 's2', 2, 'c'), (4, 's3', 3, 'd'), (5, 's1', NULL, 'e'),
 (8, 's1', 0, 'h'), (9, 's2', 7, 'i');
"""
IN_RANGE = [("filter[amount][gte]", "0")]
# ground truth: what the flow may see — consented subjects, not soft-deleted, in the filter range
# — among the rows every transaction below the horizon wrote
TRUTH = """
SELECT id, memo FROM events
WHERE subject = ANY($1::text[]) AND deleted_at IS NULL AND amount >= 0
  AND changed < pg_snapshot_xmin(pg_current_snapshot())
"""


@pytest.fixture(scope="module")
async def live(
    world: World, postgres_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[RecordsWorld]:
    async with records_world(
        world, postgres_url, tmp_path_factory.mktemp("changes"), catalogue=CATALOGUE, seed=SEED, replicas=2
    ) as running:
        yield running


@pytest.fixture
async def db(live: RecordsWorld) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(live.datasets_url)
    try:
        yield conn
    finally:
        await conn.close()


@pytest.fixture
def consented(ds: DsConnectorDouble) -> DsConnectorDouble:
    ds.set_policy(consent_policy(["s1", "s2"], dataset="events"))
    return ds


class Copy:
    """A client's synchronized copy: items upserted, tombstones removed, every answer kept."""

    def __init__(self) -> None:
        self.rows: dict[int, str] = {}
        self.tombstones: list[int] = []
        self.seen: set[int] = set()  # every key any answer named

    def apply(self, body: dict[str, Any]) -> None:
        for item in body["items"]:
            if item.get("tombstone") is True:
                assert set(item) == {"key", "tombstone"}, item  # no data in a tombstone
                self.rows.pop(int(item["key"]), None)
                self.tombstones.append(int(item["key"]))
                self.seen.add(int(item["key"]))
            else:
                assert set(item) == {"id", "subject", "amount", "memo"}, item
                self.rows[int(item["id"])] = item["memo"]
                self.seen.add(int(item["id"]))


async def changes(
    live: RecordsWorld, token: str, since: str, query: list[tuple[str, str]], replica: int = 0, **extra: str
) -> httpx.Response:
    params = [*query, ("changes_since", since), *extra.items()]
    return await live.replicas[replica % len(live.replicas)].get(
        "/dps/public/streams/events/records", params=params, headers={"Authorization": f"Bearer {token}"}
    )


async def sync(
    live: RecordsWorld, token: str, since: str, copy: Copy, query: list[tuple[str, str]] = IN_RANGE
) -> str:
    """Every answer until the horizon (has_more false), two records a page, alternating replicas;
    the last token."""
    for turn in range(100):
        r = await changes(live, token, since, query, replica=turn, limit="2")
        assert r.status_code == 200, r.text
        body = r.json()
        assert len(body["items"]) <= 2 and body["limit"] == 2
        copy.apply(body)
        since = body["next_changes_since"]
        if not body["has_more"]:
            return since
    raise AssertionError("the session never reached its horizon")


async def begun(live: RecordsWorld) -> tuple[str, Copy, str]:
    """A flow over events started, and its session synchronized from `beginning`."""
    _, token = await live.start(dataset="events")
    copy = Copy()
    return token, copy, await sync(live, token, "beginning", copy)


async def truth(db: asyncpg.Connection, subjects: list[str]) -> dict[int, str]:
    return {r["id"]: r["memo"] for r in await db.fetch(TRUTH, subjects)}


def refused(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.json()["error"] == code


async def test_issue32_a_session_follows_inserts_updates_soft_deletes_and_range_exits_on_both_replicas(
    live: RecordsWorld, consented: DsConnectorDouble, db: asyncpg.Connection
) -> None:
    token, copy, since = await begun(live)
    assert copy.rows == await truth(db, ["s1", "s2"]) and set(copy.rows) == {1, 3, 8, 9}
    assert copy.tombstones == []  # a beginning takes nothing back

    await db.execute(
        "INSERT INTO events (id, subject, amount, memo) VALUES (10, 's1', 5, 'j'), (11, 's3', 9, 'k')"
    )
    await db.execute("UPDATE events SET amount = -3 WHERE id = 1")  # leaves the filter range
    await db.execute("UPDATE events SET amount = 4 WHERE id = 2")  # enters it
    await db.execute("UPDATE events SET deleted_at = now() WHERE id = 3")  # soft-deleted
    await db.execute("UPDATE events SET memo = 'i2' WHERE id = 9")  # changed, still visible
    since = await sync(live, token, since, copy)
    assert copy.rows == await truth(db, ["s1", "s2"]) and set(copy.rows) == {2, 8, 9, 10}
    assert copy.rows[9] == "i2"
    assert {1, 3} <= set(copy.tombstones)  # a tombstone for every exit
    assert not copy.seen & {4, 11}  # s3 never consented: not even a tombstone names its rows

    await db.execute("UPDATE events SET amount = 1 WHERE id = 1")  # back in range
    await db.execute("UPDATE events SET deleted_at = now() WHERE id = 10")
    since = await sync(live, token, since, copy)
    assert copy.rows == await truth(db, ["s1", "s2"]) and set(copy.rows) == {1, 2, 8, 9}

    idle = await changes(live, token, since, IN_RANGE, replica=1)  # nothing changed since
    assert idle.status_code == 200 and idle.json()["items"] == [] and idle.json()["has_more"] is False


async def test_issue32_a_verdict_that_drops_a_subject_is_resync_required_and_its_rows_never_come_back(
    live: RecordsWorld, consented: DsConnectorDouble, db: asyncpg.Connection
) -> None:
    token, copy, since = await begun(live)
    assert 9 in copy.rows  # s2's
    consented.set_policy(consent_policy(["s1"], dataset="events"))  # s2 withdrew at ds
    for replica in (0, 1):
        gone = await changes(live, token, since, IN_RANGE, replica=replica)
        refused(gone, 409, "resync_required")
        assert "items" not in gone.json()
    again = Copy()
    since = await sync(live, token, "beginning", again)
    assert again.rows == await truth(db, ["s1"]) and not any(k in again.rows for k in (3, 9))
    await db.execute("UPDATE events SET memo = 'i3' WHERE id = 9")  # s2's row changes
    await db.execute("UPDATE events SET memo = 'h2' WHERE id = 8")
    since = await sync(live, token, since, again)
    assert 9 not in again.seen and again.rows[8] == "h2"

    consented.set_policy(consent_policy([], dataset="events"))  # every subject withdrew: a deny
    refused(await changes(live, token, since, IN_RANGE), 409, "resync_required")
    nothing = Copy()
    denied = await sync(live, token, "beginning", nothing)
    assert nothing.rows == {} and nothing.seen == set()
    assert (await changes(live, token, denied, IN_RANGE, replica=1)).json()["items"] == []
    consented.set_policy(consent_policy(["s1"], dataset="events"))  # consent given again
    refused(await changes(live, token, denied, IN_RANGE), 409, "resync_required")


async def test_issue32_a_transaction_committing_after_a_later_one_is_not_skipped(
    live: RecordsWorld, consented: DsConnectorDouble, db: asyncpg.Connection
) -> None:
    token, copy, since = await begun(live)
    early, late = await asyncpg.connect(live.datasets_url), await asyncpg.connect(live.datasets_url)
    try:
        first = early.transaction()
        await first.start()
        # the earlier transaction takes its id first, the later one commits first
        await early.execute("INSERT INTO events (id, subject, amount, memo) VALUES (20, 's1', 1, 'early')")
        async with late.transaction():
            await late.execute("INSERT INTO events (id, subject, amount, memo) VALUES (21, 's1', 1, 'late')")
        since = await sync(live, token, since, copy)
        # the horizon stays below the open transaction: the later commit waits with it
        assert not copy.seen & {20, 21}
        await first.commit()
    finally:
        await early.close()
        await late.close()
    await sync(live, token, since, copy)
    assert {20, 21} <= set(copy.rows)
    assert copy.rows == await truth(db, ["s1", "s2"])


async def test_issue32_tampered_foreign_and_refiltered_tokens_are_invalid_cursor(
    live: RecordsWorld, consented: DsConnectorDouble
) -> None:
    _, token = await live.start(dataset="events")
    _, other = await live.start(dataset="events")
    first = await changes(live, token, "beginning", IN_RANGE, limit="1")
    assert first.status_code == 200, first.text
    issued = first.json()["next_changes_since"]
    assert (await changes(live, token, issued, IN_RANGE, replica=1)).status_code == 200
    # the filter set is compared decoded: another spelling of the same value continues
    assert (await changes(live, token, issued, [("filter[amount][gte]", "0.000")])).status_code == 200
    tampered = issued[:-3] + ("AAA" if issued[-3:] != "AAA" else "BBB")
    for since, query, pull in (
        (tampered, IN_RANGE, token),
        ("not-a-token", IN_RANGE, token),
        (issued, IN_RANGE, other),  # another flow's token
        (issued, [], token),  # no filters
        (issued, [("filter[amount][gte]", "1")], token),  # another value
        (issued, [*IN_RANGE, ("filter[amount][lt]", "100")], token),  # one more filter
    ):
        refused(await changes(live, pull, since, query), 400, "invalid_cursor")
    page = await live.replicas[0].get(
        "/dps/public/streams/events/records",
        params=[*IN_RANGE, ("limit", "1")],
        headers={"Authorization": f"Bearer {token}"},
    )
    cursor = page.json()["next_cursor"]
    assert cursor is not None
    refused(await changes(live, token, cursor, IN_RANGE), 400, "invalid_cursor")  # a page cursor
    refused(await changes(live, token, "beginning", IN_RANGE, cursor=cursor), 400, "invalid_request")
    _, plain = await live.start(dataset="plain")
    r = await live.replicas[0].get(
        "/dps/public/streams/plain/records",
        params={"changes_since": "beginning"},
        headers={"Authorization": f"Bearer {plain}"},
    )
    refused(r, 403, "not_offered")  # no change order declared


async def test_issue32_rf10_every_delivered_record_is_disclosed_before_the_answer(
    live: RecordsWorld, consented: DsConnectorDouble, disclosures: TopicTail
) -> None:
    _, token = await live.start(dataset="events")
    r = await changes(live, token, "beginning", IN_RANGE, limit="3")
    assert r.status_code == 200, r.text
    [record] = await disclosures.read(1)
    event = json.loads(record.value)
    assert event["dataset_id"] == "events" and event["row_count"] == len(r.json()["items"]) == 3


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"column": "nothing"}, "records.changes column nothing is not a column of events"),
        ({"column": "memo"}, "records.changes column memo has type text; it must be xid8"),
        ({"column": "loose"}, "records.changes column loose may be NULL"),
        ({"column": "unindexed"}, "records.changes column unindexed has no index that serves it"),
        (
            {"column": "changed", "deleted": "memo"},
            "records.changes deleted memo is not a boolean or timestamp",
        ),
    ],
)
async def test_issue32_a_change_order_the_table_cannot_serve_refuses_start_up(
    world: World, live: RecordsWorld, tmp_path: Path, changes: dict[str, str], named: str
) -> None:
    catalogue = yaml.safe_load(CATALOGUE.read_text())
    catalogue["datasets"][0]["records"]["changes"] = changes
    path = tmp_path / "catalogue.yaml"
    path.write_text(yaml.safe_dump(catalogue))
    settings = world.settings(
        catalogue_path=str(path), datasets_database_url=live.datasets_url, records_cursor_secret=CURSOR_SECRET
    )
    with pytest.raises(StartupRefused, match="dataset events: " + named):
        async with running_gateway(settings):
            pass


# ---------------------------------------------------------------------- the long poll (wait=<s>)
async def test_issue32_a_long_poll_is_woken_by_a_new_row_and_delivers_it(
    live: RecordsWorld, consented: DsConnectorDouble, db: asyncpg.Connection, world: World
) -> None:
    token, _, since = await begun(live)
    async with TopicTail(world.kafka, AUDIT_DISCLOSURES) as disclosures:  # from here on
        await _woken_by_a_new_row(live, token, since, db, disclosures)


async def _woken_by_a_new_row(
    live: RecordsWorld, token: str, since: str, db: asyncpg.Connection, disclosures: TopicTail
) -> None:
    clock = asyncio.get_running_loop().time
    started = clock()
    waiting = asyncio.create_task(changes(live, token, since, IN_RANGE, replica=1, wait="20"))
    await asyncio.sleep(0.6)
    assert not waiting.done()  # nothing changed: the request waits
    await db.execute("INSERT INTO events (id, subject, amount, memo) VALUES (30, 's1', 1, 'new')")
    r = await asyncio.wait_for(waiting, 15)
    assert r.status_code == 200, r.text
    assert [item["id"] for item in r.json()["items"]] == [30]
    assert clock() - started < 10  # woken by the change, not by the end of its wait
    [record] = await disclosures.read(1)
    assert json.loads(record.value)["row_count"] == 1  # the delivery's disclosure
    assert await disclosures.quiet() == []  # and the wait disclosed nothing


async def test_issue32_a_long_poll_without_a_change_answers_empty_at_the_end_of_its_wait(
    live: RecordsWorld, consented: DsConnectorDouble
) -> None:
    token, _, since = await begun(live)
    clock = asyncio.get_running_loop().time
    started = clock()
    r = await changes(live, token, since, IN_RANGE, wait="1")
    assert r.status_code == 200, r.text
    assert r.json()["items"] == [] and r.json()["has_more"] is False
    assert 1 <= clock() - started < 8
    refused(await changes(live, token, since, IN_RANGE, wait="-1"), 400, "invalid_request")
    page = await live.replicas[0].get(
        "/dps/public/streams/events/records",
        params={"wait": "1"},
        headers={"Authorization": f"Bearer {token}"},
    )
    refused(page, 400, "invalid_request")  # wait belongs to a change session


async def test_issue32_a_long_poll_rechecks_the_flow_before_delivering(
    live: RecordsWorld, consented: DsConnectorDouble, db: asyncpg.Connection
) -> None:
    flow, token = await live.start(dataset="events")
    since = await sync(live, token, "beginning", Copy())
    waiting = asyncio.create_task(changes(live, token, since, IN_RANGE, wait="20"))
    await asyncio.sleep(0.4)
    assert await live.signal(flow, "suspend", {"reason": "pause"}) is None
    await db.execute("INSERT INTO events (id, subject, amount, memo) VALUES (31, 's1', 1, 'late')")
    r = await asyncio.wait_for(waiting, 15)
    refused(r, 401, "pull_token")  # the suspended flow's token is not live: the refusal, not the row
    assert "late" not in r.text


async def test_issue32_a_long_poll_rechecks_the_verdict_before_delivering(
    live: RecordsWorld, consented: DsConnectorDouble, db: asyncpg.Connection
) -> None:
    token, _, since = await begun(live)
    waiting = asyncio.create_task(changes(live, token, since, IN_RANGE, replica=1, wait="20"))
    await asyncio.sleep(0.4)
    consented.set_policy(consent_policy(["s1"], dataset="events"))  # s2 withdrew while it waits
    await db.execute("INSERT INTO events (id, subject, amount, memo) VALUES (32, 's2', 1, 's2 row')")
    r = await asyncio.wait_for(waiting, 15)
    refused(r, 409, "resync_required")
    assert "s2 row" not in r.text


async def test_issue32_one_watcher_per_change_column_wakes_every_waiter(live: RecordsWorld) -> None:
    pool = await asyncpg.create_pool(live.datasets_url, min_size=1, max_size=2)
    watchers = ChangeWatchers(pool)
    db = await asyncpg.connect(live.datasets_url)
    try:
        highest = int(await db.fetchval("SELECT max(changed)::text FROM events"))
        waiters = [
            asyncio.create_task(watchers.wait("events", "changed", highest + 1, 15)) for _ in range(50)
        ]
        await asyncio.sleep(0.5)
        assert watchers.watching == 1  # fifty waiters, one query per tick
        assert not any(w.done() for w in waiters)
        await db.execute("UPDATE events SET memo = memo WHERE id = 8")
        assert await asyncio.wait_for(asyncio.gather(*waiters), 10) == [True] * 50
        await asyncio.sleep(0.5)
        assert watchers.watching == 0  # nobody waits: no watcher runs
        assert await watchers.wait("events", "changed", highest + 10**9, 0.3) is False  # timed out
    finally:
        await watchers.close()
        await db.close()
        await pool.close()


async def test_issue32_a_composite_key_orders_the_session_and_names_its_tombstones(
    live: RecordsWorld, ds: DsConnectorDouble, db: asyncpg.Connection
) -> None:
    ds.set_policy(consent_policy(["s1"], dataset="pairs"))
    _, token = await live.start(dataset="pairs")

    async def answer(since: str) -> dict[str, Any]:
        r = await live.replicas[1].get(
            "/dps/public/streams/pairs/records",
            params={"changes_since": since, "limit": "1"},
            headers={"Authorization": f"Bearer {token}"},
        )
        assert r.status_code == 200, r.text
        body: dict[str, Any] = r.json()
        return body

    since, keys = "beginning", []
    while True:  # one transaction wrote them all: the record key orders them, 2 before 10
        body = await answer(since)
        keys += [[i["region"], i["seq"]] for i in body["items"]]
        since = body["next_changes_since"]
        if not body["has_more"]:
            break
    assert keys == [["north", 2], ["north", 10], ["south", 1]]
    await db.execute("UPDATE pairs SET gone = true WHERE region = 'north' AND seq = 10")
    assert (await answer(since))["items"] == [{"key": ["north", 10], "tombstone": True}]


async def test_issue31_qe10_a_change_session_runs_within_the_consumers_share(
    live: RecordsWorld, consented: DsConnectorDouble, world: World, db: asyncpg.Connection
) -> None:
    """The session's statement is the consumer's like any other (QE-10): with the consumer's whole
    total across the replicas taken (as leases in the same Redis, by statements elsewhere), an
    answer is refused 429 before it asks for a connection; once they are given back, it is served."""
    _, token = await live.start(dataset="events")
    total = Settings.model_fields["query_max_concurrent_per_consumer_total"].default
    redis = aioredis.from_url(world.redis_url)
    share = SharedShare(redis, CACHE_SECRET.encode(), total, lease_s=30, keep_s=0)
    who = consumer_key("did", CONSUMER)
    leases: list[str | None] = []
    try:
        # the replicas keep a finished statement's lease a moment (KEEP_S) before giving it back
        for _ in range(200):
            try:
                leases.append(await share.take(who))
            except ServiceError:
                await asyncio.sleep(KEEP_S)
            if len(leases) == total:
                break
        assert len(leases) == total and None not in leases
        r = await changes(live, token, "beginning", IN_RANGE)
        refused(r, 429, "too_many_concurrent_queries")
        assert r.headers.get("Retry-After")
    finally:
        for lease in leases:
            if lease is not None:
                await share.give_back(who, lease)
        await redis.aclose()
    served = await changes(live, token, "beginning", IN_RANGE)
    assert served.status_code == 200, served.text
    assert {int(item["id"]) for item in served.json()["items"]} == set(await truth(db, ["s1", "s2"]))
