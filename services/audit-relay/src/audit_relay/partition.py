"""One assigned partition: its window of fetched records (window.py), the delivery tasks the window
allows, and the commits.

The poll loop feeds records in; this worker hands each one the window allows to a task of its own
(the relay's `deliver`), settles the outcome in the window, and commits the window's commit point
in the background. A backoff blocks only this partition: the poll loop and the other partitions'
workers carry on. Fetching of the partition pauses once AUDIT_RELAY_MAX_BUFFERED_PER_PARTITION
records are waiting, and resumes when half of them are done."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import IllegalStateError, KafkaError

from audit_relay.delivery import Retry
from audit_relay.metrics import Metrics
from audit_relay.settings import Settings
from audit_relay.window import Record, Slot, Window, contiguous
from dataplane_service_kit.logs import get_logger

log = get_logger(__name__)

# what a delivery task reports besides a Retry: the record is done (ds accepted it or the DLQ holds
# it), or it was handed out but not posted, the partition having started a backoff meanwhile
Finished = Literal["finished", "held_back"]
FINISHED: Finished = "finished"
HELD_BACK: Finished = "held_back"


# a suspected hole is taken as the broker's own only after this many fetches showed the same jump
# (and AUDIT_RELAY_BROKER_HOLE_CONFIRM_S passed since the first)
HOLE_SIGHTINGS = 3


@dataclass
class SuspectGap:
    """A jump a fetch made past an offset never taken: being fetched again from `expected`."""

    expected: int
    found: int
    first_seen: float  # monotonic
    sightings: int = 1


class Host(Protocol):
    """What a worker needs of the relay that runs it (relay.py's `Relay`): the shared consumer,
    settings and metrics, fetch pausing, one delivery attempt, and the retry schedule. Declared
    here so the worker does not import the relay that imports it."""

    @property
    def settings(self) -> Settings: ...

    @property
    def metrics(self) -> Metrics: ...

    @property
    def consumer(self) -> AIOKafkaConsumer: ...

    def pause(self, worker: PartitionWorker) -> None: ...

    def resume(self, worker: PartitionWorker) -> None: ...

    async def deliver(self, slot: Slot, window: Window) -> Finished | Retry: ...

    def backoff(self, outcome: Retry) -> Callable[[int], float]: ...

    def count_retry(self, outcome: Retry, slot: Slot, delay_s: float | None) -> None: ...


class PartitionWorker:
    def __init__(self, relay: Host, tp: TopicPartition) -> None:
        self.relay = relay
        self.tp = tp
        settings = relay.settings
        self.window = Window(settings.audit_relay_max_in_flight_per_partition)
        self._max_buffered = settings.audit_relay_max_buffered_per_partition
        self.fetch_paused = False
        # the offset after the last record taken into the window (None until one is), and the
        # hole a re-fetch is checking: a fetch that does not continue there is fetched again
        self.next_offset: int | None = None
        self._suspect_gap: SuspectGap | None = None
        self._hole_confirm_s = settings.audit_relay_broker_hole_confirm_s
        self.committed_offset: int | None = None
        # the first offset this worker took: the commit check's base when the group has no
        # committed offset yet (the consumer started where auto_offset_reset put it)
        self._first_offset: int | None = None
        self._wake = asyncio.Event()
        self._dirty = asyncio.Event()
        self._commit_lock = asyncio.Lock()
        self._deliveries: set[asyncio.Task[None]] = set()
        name = f"audit-relay-{tp.topic}-{tp.partition}"
        self._name = name
        self.task = asyncio.create_task(self._run(), name=name)
        self._committer = asyncio.create_task(self._commit_loop(), name=f"{name}-commit")

    # -- records in -----------------------------------------------------------------------------
    def feed(self, records: Sequence[Record]) -> None:
        """Take what fits; the rest is fetched again once there is room (seek back to it), so what
        is buffered never exceeds the bound, whatever one fetch returned."""
        room = self._max_buffered - len(self.window)
        offsets = [r.offset for r in records]
        whole = contiguous(self.next_offset, offsets, self._confirmed_hole())
        taken = records[: max(0, min(room, whole))]
        if taken:
            self._settle_gap(taken[0].offset)
            # the jumps intake accepted (the broker's own holes) are the only holes the commit
            # check lets pass (commit)
            previous = self.next_offset
            for record in taken:
                if previous is not None and record.offset != previous:
                    self.window.broker_holes.add((previous, record.offset))
                previous = record.offset + 1
            if self._first_offset is None:
                self._first_offset = taken[0].offset
            self.window.add(taken)
            self.next_offset = taken[-1].offset + 1
        self.relay.metrics.buffered.inc(len(taken))
        if whole < len(records) and len(taken) == whole:
            # RF-10: a record was never handed to this worker (the fetch jumped past it): take
            # nothing beyond it and fetch again from the offset that is missing, until it comes
            # back or the same jump has lasted AUDIT_RELAY_BROKER_HOLE_CONFIRM_S
            assert self.next_offset is not None
            self._suspect(self.next_offset, records[whole].offset)
            self.relay.consumer.seek(self.tp, self.next_offset)
        elif len(taken) < len(records):
            self.relay.consumer.seek(self.tp, records[len(taken)].offset)
        if len(self.window) >= self._max_buffered:
            self.relay.pause(self)
        self._wake.set()

    def _suspect(self, expected: int, found: int) -> None:
        """A fetch jumped from `expected` to `found`: the first sighting of this jump is logged;
        the same jump again only adds a sighting."""
        suspect = self._suspect_gap
        if suspect is not None and (suspect.expected, suspect.found) == (expected, found):
            suspect.sightings += 1
            return
        self._suspect_gap = SuspectGap(expected, found, time.monotonic())
        log.warning("offset_gap_suspected", partition=self.tp.partition, expected=expected, fetched=found)

    def _confirmed_hole(self) -> tuple[int, int] | None:
        """The jump intake may take: the suspected one, once the broker has shown it on several
        fetches over AUDIT_RELAY_BROKER_HOLE_CONFIRM_S. A broker that shows a later batch before an
        earlier one shows the same jump for a few milliseconds, then the earlier batch: two quick
        sightings prove nothing."""
        suspect = self._suspect_gap
        if suspect is None or suspect.sightings < HOLE_SIGHTINGS:
            return None
        if time.monotonic() - suspect.first_seen < self._hole_confirm_s:
            return None
        return suspect.expected, suspect.found

    def _settle_gap(self, first: int) -> None:
        """A re-fetch after a suspected hole answered: the missing record came back (the fetch
        had jumped past it: counted in audit_relay_fetch_jumps_total, logged), or the jump lasted
        long enough to be the broker's own hole (taken)."""
        suspect = self._suspect_gap
        if suspect is None:
            return
        self._suspect_gap = None
        skipped = first == suspect.expected
        if skipped:
            self.relay.metrics.fetch_jumps.inc()
        (log.warning if skipped else log.info)(
            "fetch_jump" if skipped else "broker_offset_gap",
            partition=self.tp.partition,
            expected=suspect.expected,
            fetched=suspect.found,
            sightings=suspect.sightings,
        )

    # -- sending --------------------------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            self._wake.clear()
            now = time.monotonic()
            while (slot := self.window.next_to_send(now)) is not None:
                task = asyncio.create_task(self._attempt(slot), name=f"{self._name}-{slot.record.offset}")
                self._deliveries.add(task)
                task.add_done_callback(self._deliveries.discard)
            wait_s = self.window.wait_s(now)
            if wait_s is None:
                await self._wake.wait()
            else:  # a backoff: wake when it ends, or earlier if a task settles
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), wait_s)

    async def _attempt(self, slot: Slot) -> None:
        """One attempt at one record. An unexpected error (a bug) must neither kill the partition
        silently nor skip the record: it is logged and the record retried like a failed post."""
        window = self.window
        try:
            result = await self.relay.deliver(slot, window)
        except Exception as exc:
            log.error("handle_failed", partition=self.tp.partition, offset=slot.record.offset, exc_info=exc)
            result = Retry("internal")
        if window is self.window:  # else the window was dropped by a re-fetch (_refetch)
            self._settle(slot, result)

    def _settle(self, slot: Slot, result: Finished | Retry) -> None:
        if result == FINISHED:
            before = len(self.window)
            if self.window.done(slot):
                self.relay.metrics.buffered.dec(before - len(self.window))
                self._dirty.set()
                if self.fetch_paused and len(self.window) <= self._max_buffered // 2:
                    self.relay.resume(self)
        elif result == HELD_BACK:
            self.window.not_posted(slot)
        else:
            assert isinstance(result, Retry)
            slot.attempts += 1
            delay = self.window.failed(slot, time.monotonic(), self.relay.backoff(result))
            self.relay.count_retry(result, slot, delay)
        self._wake.set()

    # -- commits --------------------------------------------------------------------------------
    async def _commit_loop(self) -> None:
        """Commit the newest commit point in the background, so delivery does not wait for the
        broker and a crash redelivers at most the records finished since the last commit."""
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            await self.commit()

    async def commit(self, *, refetch: bool = True) -> None:
        # one commit at a time per partition, so a slower older commit never lands after a newer one
        async with self._commit_lock:
            offset = self.window.commit_offset
            if offset is None or offset == self.committed_offset:
                return
            base = await self._commit_base()
            if base is None:
                return  # the group's offset could not be read: a later commit checks again
            gap = self.window.unaccounted(base)
            if gap is not None:
                # RF-10: an offset between the last commit and this one was never delivered nor
                # dead-lettered, and the broker did not jump it. Committing would skip it for
                # good; fetch everything again from the last commit instead (at least once: what
                # was delivered past it is posted again, same Idempotency-Key). Offsets only.
                self.relay.metrics.offset_gaps.inc()
                log.error(
                    "offset_gap_at_commit",
                    partition=self.tp.partition,
                    committed=base,
                    expected=gap[0],
                    found=gap[1],
                    refused_commit=offset,
                )
                if refetch:
                    self._refetch(base)
                return
            try:
                await self.relay.consumer.commit({self.tp: offset})
            except KafkaError as exc:  # a later commit covers it; the records stay at least once
                log.warning("commit_failed", partition=self.tp.partition, error=type(exc).__name__)
                return
            self.committed_offset = offset
            self.window.committed(offset)

    async def _commit_base(self) -> int | None:
        """The offset the last commit left: this worker's, else the group's (read once), else the
        first offset this worker took (the group had none)."""
        if self.committed_offset is not None:
            return self.committed_offset
        try:
            committed: int | None = await self.relay.consumer.committed(self.tp)
        except KafkaError as exc:
            log.warning("committed_read_failed", partition=self.tp.partition, error=type(exc).__name__)
            return None
        if committed is None:
            committed = self._first_offset
        else:
            self.committed_offset = committed
        return committed

    def _refetch(self, base: int) -> None:
        """Drop the window (its posts in flight are abandoned and their outcomes ignored) and
        fetch the partition again from `base`, the intake expecting exactly that offset first."""
        old = self.window
        for task in list(self._deliveries):
            task.cancel()
        self.relay.metrics.buffered.dec(len(old))
        self.window = Window(old.max_in_flight)
        self.next_offset = base
        self._suspect_gap = None
        with contextlib.suppress(IllegalStateError):  # revoked meanwhile: the next owner fetches
            self.relay.consumer.seek(self.tp, base)
        if self.fetch_paused:
            self.relay.resume(self)
        self._wake.set()

    async def stop(self) -> None:
        """Stop delivering (posts in flight are abandoned: the next owner sends them again, with
        the same Idempotency-Key), then commit what is finished."""
        tasks = [self.task, self._committer, *self._deliveries]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.relay.metrics.buffered.dec(len(self.window))
        # no re-fetch on a hole here: the partition is going; its next owner starts at the commit
        await self.commit(refetch=False)
