"""RF-10 at the relay's intake (issue 35): a fetch that does not continue where the partition's last
taken record ended is never taken past the hole. The worker fetches again from the missing offset;
the record that comes back is delivered, and the jump is counted (`audit_relay_fetch_jumps_total`);
a commit past a hole is refused and counted (`audit_relay_offset_gaps_total`).
A hole the broker keeps showing (transaction markers, compaction) is taken once it has lasted
AUDIT_RELAY_BROKER_HOLE_CONFIRM_S over several fetches; a batch the broker shows late (after a
later one, as the local broker does under concurrent producers) is waited for, never skipped. And
the commit check: a commit that would pass an offset never delivered is refused and the partition
fetched again from the last commit.

The model: a partition log, and a fetcher that, at random, jumps past a record at a fetch boundary
(what the relay was seen to do once in ten thousand events) or returns fewer records than asked
(fetch boundaries). The property: every offset of the log is handed to the window exactly once, in
order, before the commit point passes it, and the commit point never passes an offset never
delivered."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from aiokafka import TopicPartition
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

from audit_relay.metrics import Metrics
from audit_relay.partition import FINISHED, PartitionWorker
from audit_relay.window import Slot, Window, contiguous


@dataclass
class _Record:
    offset: int
    topic: str = "t"
    partition: int = 0
    timestamp: int = 0
    key: bytes | None = None
    value: bytes | None = None
    headers: Sequence[tuple[str, bytes]] = ()


@dataclass
class _Consumer:
    """Holds a position; `seek` moves it, as aiokafka's does."""

    position: int = 0
    seeks: list[int] = field(default_factory=list)
    commits: list[int] = field(default_factory=list)

    def seek(self, _tp: Any, offset: int) -> None:
        self.position = offset
        self.seeks.append(offset)

    def assignment(self) -> set[Any]:
        return set()

    async def commit(self, offsets: dict[Any, int]) -> None:
        self.commits.extend(offsets.values())

    async def committed(self, _tp: Any) -> int | None:
        return self.commits[-1] if self.commits else None


class _Relay:
    """What a PartitionWorker reads of its relay: settings, metrics, the consumer, delivery."""

    def __init__(self, buffered: int, hole_confirm_s: float = 5.0) -> None:
        self.settings = SimpleNamespace(
            audit_relay_max_in_flight_per_partition=8,
            audit_relay_max_buffered_per_partition=buffered,
            audit_relay_broker_hole_confirm_s=hole_confirm_s,
        )
        self.metrics = Metrics()
        self.consumer = _Consumer()
        self.delivered: list[int] = []

    async def deliver(self, slot: Slot, _window: Window) -> str:
        self.delivered.append(slot.record.offset)
        await asyncio.sleep(0)
        return FINISHED

    def pause(self, worker: PartitionWorker) -> None:
        worker.fetch_paused = True

    def resume(self, worker: PartitionWorker) -> None:
        worker.fetch_paused = False


def _counted(relay: _Relay, name: str) -> float:
    text = generate_latest(relay.metrics.registry).decode()
    line = next(x for x in text.splitlines() if x.startswith(f"{name} "))
    return float(line.split()[1])


def _jumps(relay: _Relay) -> float:
    """Fetches that jumped past a record and were fetched again (intake)."""
    return _counted(relay, "audit_relay_fetch_jumps_total")


def _gaps(relay: _Relay) -> float:
    """Commits refused by the check before every commit."""
    return _counted(relay, "audit_relay_offset_gaps_total")


def test_contiguous_stops_at_a_hole_and_takes_a_confirmed_one() -> None:
    assert contiguous(None, [5, 6, 7], None) == 3
    assert contiguous(5, [5, 6, 8, 9], None) == 2
    assert contiguous(5, [7, 8], None) == 0
    assert contiguous(5, [7, 8], (5, 7)) == 2  # the broker jumped the same way twice
    assert contiguous(5, [5, 7], (6, 7)) == 2


async def _drive(
    log_size: int,
    skips: set[int],
    short: list[int],
    buffered: int,
    holes: frozenset[int] = frozenset(),
    late: dict[int, int] | None = None,
    hole_confirm_s: float = 5.0,
) -> _Relay:
    """Fetch from the model log at the consumer's position until the log is drained; a fetch
    whose first offset is in `skips` jumps one record (once each), `short` gives fetch sizes,
    `holes` are offsets the log never has, and `late` hides an offset from the first n fetches
    that reach it (a batch the broker shows after a later one)."""
    relay = _Relay(buffered, hole_confirm_s)
    hidden = dict(late or {})
    worker = PartitionWorker(relay, TopicPartition("t", 0))  # type: ignore[arg-type]
    pending_skips = set(skips)
    sizes = iter(short)
    try:
        for _ in range(log_size * 4 + 20):
            await asyncio.sleep(0)
            if worker.fetch_paused:
                continue
            start = relay.consumer.position
            if start >= log_size:
                if not len(worker.window):
                    break
                continue
            if start in pending_skips and start + 1 < log_size:
                pending_skips.discard(start)
                start += 1  # the fault: a record left out at a fetch boundary
            size = next(sizes, 7)
            offsets = [o for o in range(start, min(log_size, start + max(1, size))) if o not in holes]
            for o in list(offsets):
                if hidden.get(o, 0) > 0:
                    hidden[o] -= 1
                    offsets = [x for x in offsets if x != o]
            if not offsets:
                relay.consumer.position = start + max(1, size)
                continue
            records = [_Record(o) for o in offsets]
            relay.consumer.position = records[-1].offset + 1
            worker.feed(records)
        for _ in range(50):
            await asyncio.sleep(0)
        await worker.commit()
    finally:
        await worker.stop()
    return relay


@settings(max_examples=60, deadline=None)
@given(
    log_size=st.integers(min_value=1, max_value=120),
    skips=st.sets(st.integers(min_value=1, max_value=119), max_size=6),
    short=st.lists(st.integers(min_value=1, max_value=20), max_size=60),
    buffered=st.integers(min_value=8, max_value=40),
)
def test_rf10_every_fetched_offset_is_delivered_once_and_a_skip_is_counted(
    log_size: int, skips: set[int], short: list[int], buffered: int
) -> None:
    relay = asyncio.run(_drive(log_size, skips, short, buffered))
    assert sorted(relay.delivered) == list(range(log_size))  # none skipped, none twice
    assert relay.consumer.commits == sorted(relay.consumer.commits)
    assert relay.consumer.commits[-1] == log_size  # committed to the end, never past a record
    effective = {s for s in skips if s < log_size - 1}
    assert _jumps(relay) <= len(effective)
    if not effective:
        assert _jumps(relay) == 0
    assert _gaps(relay) == 0  # intake never left the commit a hole to refuse


def test_rf10_a_skipped_record_is_fetched_again_counted_and_delivered() -> None:
    relay = asyncio.run(_drive(30, {10}, [5] * 10, 64))
    assert sorted(relay.delivered) == list(range(30))
    assert (_jumps(relay), _gaps(relay)) == (1, 0)
    assert 10 in relay.consumer.seeks  # fetched again from the missing offset


def test_rf10_a_batch_the_broker_shows_late_is_waited_for_not_skipped() -> None:
    # offset 12 is missing from the first four fetches that reach it, 13 and on are there: the
    # previous rule (a jump seen twice is the broker's own hole) took 13 and skipped 12 for good
    relay = asyncio.run(_drive(30, set(), [5] * 20, 64, late={12: 4}))
    assert sorted(relay.delivered) == list(range(30))
    assert (_jumps(relay), _gaps(relay)) == (1, 0)
    assert relay.consumer.commits[-1] == 30


def test_a_hole_the_broker_keeps_showing_is_taken_and_not_counted() -> None:
    relay = asyncio.run(_drive(30, set(), [5] * 12, 64, holes=frozenset({12}), hole_confirm_s=0.0))
    assert sorted(relay.delivered) == [o for o in range(30) if o != 12]
    assert (_jumps(relay), _gaps(relay)) == (0, 0)
    assert relay.consumer.commits[-1] == 30


def test_rf10_a_commit_past_an_offset_never_delivered_is_refused_and_fetched_again() -> None:
    """The check before every commit, reached by going around intake (as a bug in it would):
    offsets 3 and 4 done, 2 never seen. The commit of 5 is refused, counted, and the partition is
    fetched again from the last commit (2); once 2 comes back, the commit goes through."""

    async def scenario() -> _Relay:
        relay = _Relay(64)
        worker = PartitionWorker(relay, TopicPartition("t", 0))  # type: ignore[arg-type]
        try:
            worker.feed([_Record(0), _Record(1)])
            await _settle()
            await worker.commit()
            assert relay.consumer.commits == [2]
            worker.window.add([_Record(3), _Record(4)])  # around intake
            worker.next_offset = 5
            worker._wake.set()  # what feed does once records are in
            await _settle()
            await worker.commit()
            assert relay.consumer.commits == [2]  # not 5: offset 2 was never delivered
            assert relay.consumer.seeks[-1] == 2
            assert worker.next_offset == 2
            worker.feed([_Record(2), _Record(3), _Record(4)])
            await _settle()
            await worker.commit()
        finally:
            await worker.stop()
        return relay

    relay = asyncio.run(scenario())
    assert relay.consumer.commits == [2, 5]
    assert 2 in relay.delivered
    assert (_jumps(relay), _gaps(relay)) == (0, 1)


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)
