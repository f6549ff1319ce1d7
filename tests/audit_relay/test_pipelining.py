"""RF-10 with several posts in flight (window.py): the bounds hold, a commit never passes an event
ds has not accepted, a partition in backoff retries its oldest event alone while the others flow,
and a restart sends again exactly what was not committed. ds here is an observing double (a real
HTTP server, harness.ObservingDs) that records when each post started and ended."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition

from dataplane_local.doubles.server import RunningServer, serve_in_thread
from dataplane_testing import audit_relay as h
from dataplane_testing.processes import ServiceProcess

PER_PARTITION = 3
PER_CONNECTOR = 5
BUFFERED = 8


@dataclass
class Observed:
    ds: h.ObservingDs
    server: RunningServer
    relay: ServiceProcess
    topic: str
    group: str


async def _own_relay(
    harness: h.Harness, name: str, ds_url: str, **overrides: str
) -> tuple[str, str, str, dict[str, str]]:
    """Topics and a consumer group of one relay's own, and its environment: (suffix, topic,
    group, env)."""
    suffix = uuid.uuid4().hex[:8]
    topic, dlq_topic = f"test.audit.{name}.{suffix}", f"test.audit.{name}.{suffix}.dlq"
    await h.make_topics(harness.bootstrap, topic, dlq_topic)
    group = f"relay-{name}-{suffix}"
    env = h.relay_env(
        harness.bootstrap, topic, dlq_topic, group, harness.issuer, {h.PROVIDER_A: ds_url}, **overrides
    )
    return suffix, topic, group, env


@pytest.fixture(scope="module")
async def observed(harness: h.Harness) -> AsyncIterator[Observed]:
    """A relay of its own with small bounds, in front of the observing double."""
    ds = h.ObservingDs()
    server = serve_in_thread(ds.app())
    _, topic, group, env = await _own_relay(
        harness,
        "pipe",
        server.url,
        AUDIT_RELAY_MAX_IN_FLIGHT_PER_PARTITION=str(PER_PARTITION),
        AUDIT_RELAY_MAX_IN_FLIGHT_PER_CONNECTOR=str(PER_CONNECTOR),
        AUDIT_RELAY_MAX_BUFFERED_PER_PARTITION=str(BUFFERED),
    )
    relay = h.relay_process(env, Path(tempfile.mkdtemp(prefix="audit-relay-pipe-")) / "relay.log")
    relay.start()
    try:
        await relay.wait_ready()
        yield Observed(ds, server, relay, topic, group)
    finally:
        relay.stop()
        server.stop()


async def _publish(harness: h.Harness, topic: str, partition: int, n: int, tag: str) -> list[dict[str, Any]]:
    events = [h.event(h.PROVIDER_A, dataset_id=f"{tag}-{partition}-{i}", row_count=i) for i in range(n)]
    for ev in events:
        await harness.producer.send_and_wait(
            topic, h.json_bytes(ev), key=h.PROVIDER_A.encode(), partition=partition
        )
    return events


def _ids(events: list[dict[str, Any]]) -> list[str]:
    return [str(ev["event_id"]) for ev in events]


def _every_post_carries_its_event_id(posts: list[h.Post], events: list[dict[str, Any]]) -> None:
    by_dataset = {ev["dataset_id"]: ev["event_id"] for ev in events}
    for post in posts:
        assert post.key == by_dataset[post.body["dataset_id"]]


async def _wait_accepted(ds: h.ObservingDs, ids: list[str], timeout: float = 60) -> None:
    await h.wait_for(lambda: set(ds.accepted(ids)) >= set(ids), timeout, f"{len(ids)} accepted")


async def _wait_committed(bootstrap: str, group: str, tp: TopicPartition, offset: int) -> None:
    async def reached() -> bool:
        return bool(await h.committed(bootstrap, group, tp) == offset)

    await h.wait_for(reached, 30, f"commit at {offset}")


async def test_rf10_posts_in_flight_stay_within_the_partition_and_connector_bounds(
    harness: h.Harness, observed: Observed
) -> None:
    ds = observed.ds
    ds.delay_s = 0.1  # long enough for posts to pile up against the bounds
    try:
        by_partition = {p: await _publish(harness, observed.topic, p, 20, "bounds") for p in (0, 1, 2)}
        events = [ev for evs in by_partition.values() for ev in evs]
        ids = _ids(events)

        buffered_seen = 0.0

        async def sample_buffered() -> None:
            nonlocal buffered_seen
            while True:
                text = await asyncio.to_thread(observed.relay.metrics)
                buffered_seen = max(buffered_seen, h.sample(text, "audit_relay_buffered_records"))
                await asyncio.sleep(0.05)

        sampler = asyncio.create_task(sample_buffered())
        try:
            await _wait_accepted(ds, ids)
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
    finally:
        ds.delay_s = 0.0

    posts = ds.posts(ids)
    # no fault: each event posted once, with its own id as Idempotency-Key
    assert Counter(p.key for p in posts) == Counter(ids)
    _every_post_carries_its_event_id(posts, events)
    # the connector bound holds over all partitions, and was used: several posts at once
    assert 2 <= h.max_overlap(posts) <= PER_CONNECTOR
    deepest = 0
    for evs in by_partition.values():
        mine = ds.posts(_ids(evs))
        deepest = max(deepest, h.max_overlap(mine))
        assert h.max_overlap(mine) <= PER_PARTITION
        # the window: an event's post starts only after every event PER_PARTITION or more places
        # before it has been answered
        place = {key: i for i, key in enumerate(_ids(evs))}
        for post in mine:
            for earlier in mine:
                if place[str(earlier.key)] <= place[str(post.key)] - PER_PARTITION:
                    assert earlier.ended <= post.started
    assert deepest > 1  # pipelined within a partition, not one post at a time
    # back-pressure: never more fetched and unfinished than the bound per partition
    assert 0 < buffered_seen <= BUFFERED * len(by_partition)
    # and once delivered, committed to the end
    for p, evs in by_partition.items():
        await _wait_committed(harness.bootstrap, observed.group, TopicPartition(observed.topic, p), len(evs))


async def test_rf10_a_partition_in_backoff_retries_only_its_oldest_event_while_another_flows(
    harness: h.Harness, observed: Observed
) -> None:
    ds = observed.ds
    stuck_partition, flowing_partition = 3, 4
    stuck = [h.event(h.PROVIDER_A, dataset_id=f"stuck-{i}") for i in range(8)]
    stuck_ids = _ids(stuck)
    ds.failing = set(stuck_ids)  # ds refuses these with 503, the same connector takes the others
    try:
        for ev in stuck:
            await harness.producer.send_and_wait(
                observed.topic, h.json_bytes(ev), key=h.PROVIDER_A.encode(), partition=stuck_partition
            )
        flowing = await _publish(harness, observed.topic, flowing_partition, 20, "flowing")
        await _wait_accepted(ds, _ids(flowing))
        # the oldest stuck event is retried (backoff 0.1 s doubling to 1 s) ...
        await h.wait_for(lambda: len(ds.posts(stuck_ids[:1])) >= 3, 30, "the oldest stuck event retried")
        attempts = Counter(p.key for p in ds.posts(stuck_ids))
        # ... and it alone: the others of its window were tried once, with it, before the first
        # 503 came back; the ones beyond the window never left the relay
        assert all(attempts[k] <= 1 for k in stuck_ids[1:PER_PARTITION])
        assert all(attempts[k] == 0 for k in stuck_ids[PER_PARTITION:])
        assert ds.accepted(stuck_ids) == []
        tp = TopicPartition(observed.topic, stuck_partition)
        assert await h.committed(harness.bootstrap, observed.group, tp) is None  # nothing accepted yet
    finally:
        ds.failing = set()

    await _wait_accepted(ds, stuck_ids)
    accepted = ds.accepted(stuck_ids)
    assert Counter(accepted) == Counter(stuck_ids)  # each exactly once
    assert accepted[0] == stuck_ids[0]  # the failed event went first once ds answered
    h.assert_bounded_order(accepted, stuck_ids, PER_PARTITION)
    _every_post_carries_its_event_id(ds.posts(stuck_ids), stuck)
    await _wait_committed(harness.bootstrap, observed.group, tp, len(stuck))


@pytest.mark.slow
async def test_rf10_commit_stops_before_a_failing_event_and_a_restart_sends_it_again(
    harness: h.Harness, observed: Observed
) -> None:
    """A failing event in the middle of a partition: the events after it are delivered, the commit
    stops right before it, and a relay started after a crash delivers it and sends again only
    what the commit did not cover (each time with the same Idempotency-Key)."""
    ds = observed.ds
    suffix, topic, group, env = await _own_relay(harness, "commit", observed.server.url)
    assert h.window_of(env) > 20  # the default window: all 20 go out at once
    log = Path(tempfile.mkdtemp(prefix="audit-relay-commit-")) / "relay.log"
    events = await _publish(harness, topic, 0, 20, f"commit-{suffix}")
    ids = _ids(events)
    failing = ids[5]
    ds.failing = {failing}
    tp = TopicPartition(topic, 0)
    first, second = h.relay_process(dict(env), log), h.relay_process(dict(env), log)
    try:
        first.start()
        await _wait_accepted(ds, ids[:5] + ids[6:])
        await _wait_committed(harness.bootstrap, group, tp, 5)
        # it stays there however long the event keeps failing: never past an unaccepted offset
        for _ in range(5):
            await asyncio.sleep(0.2)
            assert await h.committed(harness.bootstrap, group, tp) == 5
        assert ds.accepted([failing]) == [] and len(ds.posts([failing])) >= 2
        # the lag says so too: 15 records not committed
        await h.wait_for(
            lambda: f'audit_relay_consumer_lag{{partition="0",topic="{topic}"}} 15.0' in first.metrics(),
            15,
            "lag of 15",
        )
        first.kill()

        ds.failing = set()
        second.start()
        await _wait_accepted(ds, [failing])
        # what was accepted after the failing event was not committed: it comes again
        await h.wait_for(
            lambda: all(Counter(ds.accepted(ids[6:]))[k] == 2 for k in ids[6:]), 60, "redelivery"
        )
        await _wait_committed(harness.bootstrap, group, tp, 20)
    finally:
        first.stop()
        second.stop()
        ds.failing = set()

    accepted = Counter(ds.accepted(ids))
    assert all(accepted[k] == 1 for k in ids[:5])  # committed before the crash: never sent again
    assert accepted[failing] == 1
    assert all(accepted[k] == 2 for k in ids[6:])  # at least once: a duplicate, same key
    _every_post_carries_its_event_id(ds.posts(ids), events)


@pytest.mark.slow
async def test_rf10_commit_stops_before_an_event_ds_holds_and_a_restart_delivers_it(
    harness: h.Harness, observed: Observed
) -> None:
    """ds holds one post unanswered while it accepts every event after it: the commit stays right
    before the held event; the relay is killed with that post still in flight; a relay started
    again delivers it (with its own Idempotency-Key) and commits to the end."""
    ds = observed.ds
    suffix, topic, group, env = await _own_relay(
        harness,
        "held",
        observed.server.url,
        # the held post stays in flight until the kill: no timeout and retry in between
        AUDIT_RELAY_HTTP_TIMEOUT_S="600",
    )
    assert h.window_of(env) > 20  # the default window: all 20 go out at once
    log = Path(tempfile.mkdtemp(prefix="audit-relay-held-")) / "relay.log"
    events = await _publish(harness, topic, 0, 20, f"held-{suffix}")
    ids = _ids(events)
    held = ids[5]
    ds.hold([held])
    tp = TopicPartition(topic, 0)
    first, second = h.relay_process(dict(env), log), h.relay_process(dict(env), log)
    try:
        first.start()
        await _wait_accepted(ds, ids[:5] + ids[6:])
        await _wait_committed(harness.bootstrap, group, tp, 5)
        assert ds.held == 1  # the held event's post is in flight, unanswered
        for _ in range(5):  # and the commit stays before it however long ds holds it
            await asyncio.sleep(0.2)
            assert await h.committed(harness.bootstrap, group, tp) == 5
        assert ds.accepted([held]) == []
        first.kill()

        ds.release()  # the killed relay's post ends unaccepted (503); ds answers again
        second.start()
        await _wait_accepted(ds, [held])
        await _wait_committed(harness.bootstrap, group, tp, 20)
    finally:
        first.stop()
        second.stop()
        ds.release()

    accepted = Counter(ds.accepted(ids))
    assert accepted[held] == 1  # delivered after the restart
    assert all(accepted[k] == 1 for k in ids[:5])  # committed before the kill: never sent again
    assert all(accepted[k] == 2 for k in ids[6:])  # accepted past the commit: sent again, same key
    _every_post_carries_its_event_id(ds.posts(ids), events)
