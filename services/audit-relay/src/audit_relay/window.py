"""One partition's fetched records and what may be sent, committed or retried next. No I/O.

The rules, in one place:

- **Window.** A record may be sent only while it is among the first `max_in_flight` records not
  yet finished (the head and the ones after it). So at most `max_in_flight` posts of a partition
  are in flight, and ds sees a record only after every record `max_in_flight` or more places
  before it was accepted (or dead-lettered): a bounded reordering, none with `max_in_flight=1`.
- **Commit.** The commit point is the offset after the longest finished prefix: a record finished
  out of order waits for every record before it, so the commit never passes a record ds has not
  accepted (or the DLQ does not hold).
- **Retry, head first.** A transient failure blocks the partition for a backoff; after it, the
  lowest unfinished record is sent alone (the probe), and only once ds accepts it does the
  partition send the rest again — the other failed ones first, lowest first. So an outage costs
  one post per backoff, not a window's worth, and a failed record is always retried before
  anything of its partition that was never sent.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol


class Record(Protocol):
    """The parts of an aiokafka ConsumerRecord the relay reads (aiokafka ships no type hints)."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes]]


class State(Enum):
    PENDING = "pending"  # never sent, or waiting to be retried
    SENDING = "sending"  # handed to a delivery task
    DONE = "done"  # ds accepted it, or the DLQ holds it


@dataclass(eq=False)
class Slot:
    """One fetched record and its delivery state. `seq` is its place in the partition's fetch
    order (offsets can have gaps: transaction markers, compaction)."""

    record: Record
    seq: int
    state: State = State.PENDING
    # whatever the delivery code works out once (parsed event, connector, body, dead letter)
    prepared: object = None
    # the connector it has been sent to at least once and not yet delivered to (readiness)
    connector: str | None = None
    attempts: int = 0

    def __lt__(self, other: Slot) -> bool:  # heap order: lowest place first
        return self.seq < other.seq


def contiguous(expected: int | None, offsets: Sequence[int], confirmed_gap: tuple[int, int] | None) -> int:
    """How many of a fetch's records (their `offsets`, in order) continue the partition without
    a hole: each one's offset is the one after the record before it, the first one `expected`
    (None: nothing taken yet, anything continues). A hole is accepted only where it is
    `confirmed_gap` (the same jump from the same offset, shown by the broker on fetches made again
    from it for long enough: partition.py), as transaction markers and compaction leave; anything
    else is fetched again."""
    taken = 0
    for offset in offsets:
        if expected is not None and offset != expected and (expected, offset) != confirmed_gap:
            break
        expected = offset + 1
        taken += 1
    return taken


def unaccounted(
    base: int, finished: Iterable[int], holes: Collection[tuple[int, int]]
) -> tuple[int, int] | None:
    """The first hole (expected, found) in `finished` (offsets done, in commit order) counted from
    `base` (the last committed offset) that is not one of `holes` (jumps the broker itself made:
    transaction markers, compaction), or None when every offset from `base` up to the last one is
    done or the broker's own. A commit past such a hole would skip a disclosure (RF-10)."""
    expected = base
    for offset in finished:
        if offset > expected and (expected, offset) not in holes:
            return expected, offset
        # an offset below `expected` is done twice (at least once allows it), never a skip
        expected = max(expected, offset + 1)
    return None


@dataclass
class Window:
    max_in_flight: int
    _slots: deque[Slot] = field(default_factory=deque)
    _next_seq: int = 0
    # the next never-sent slot, as an index into _slots (shifted as the head is dropped)
    _cursor: int = 0
    # slots to send again (failed, or handed out but not sent after all), lowest place first
    _again: list[Slot] = field(default_factory=list)
    in_flight: int = 0
    # the offset to commit: every record before it is done; None until one is
    commit_offset: int | None = None
    # consecutive failed attempts of this partition's probe (the backoff exponent)
    failures: int = 0
    probing: bool = False
    probe: Slot | None = None
    blocked_until: float = 0.0
    # what the commit check reads (unaccounted): the offsets done since the last verified commit,
    # in commit order, and the holes the broker itself showed (start, end) that may be passed
    finished: list[int] = field(default_factory=list)
    broker_holes: set[tuple[int, int]] = field(default_factory=set)

    def __len__(self) -> int:
        """Fetched and not yet done: what back-pressure bounds."""
        return len(self._slots)

    def add(self, records: Iterable[Record]) -> None:
        for record in records:
            self._slots.append(Slot(record, self._next_seq))
            self._next_seq += 1

    # -- what to send ---------------------------------------------------------------------------
    def next_to_send(self, now: float) -> Slot | None:
        """The next slot to hand out, marked SENDING; None when the window, a backoff or a probe
        in flight says wait."""
        if now < self.blocked_until or not self._slots:
            return None
        if self.probing and self.probe is not None:
            return None  # one probe at a time
        if self._again:
            slot = self._again[0]
        elif self._cursor < len(self._slots):
            slot = self._slots[self._cursor]
        else:
            return None
        if slot.seq - self._slots[0].seq >= self.max_in_flight:
            return None  # beyond the window: the head has to finish first
        if self._again:
            heapq.heappop(self._again)
        else:
            self._cursor += 1
        if self.probing:
            self.probe = slot
        slot.state = State.SENDING
        self.in_flight += 1
        return slot

    def may_post(self, slot: Slot, now: float) -> bool:
        """Still allowed to post `slot` (checked once a connector slot is free): a failure of
        another record since it was handed out means only the probe may go."""
        return now >= self.blocked_until and (not self.probing or self.probe is slot)

    # -- outcomes -------------------------------------------------------------------------------
    def done(self, slot: Slot) -> bool:
        """ds accepted it or the DLQ holds it. True when the commit point moved."""
        self._finish(slot)
        slot.state = State.DONE
        slot.connector = None
        if slot is self.probe:  # ds answered the probe: the partition flows again
            self.probe = None
            self.probing = False
            self.failures = 0
        elif not self.probing:
            self.failures = 0
        moved = False
        while self._slots and self._slots[0].state is State.DONE:
            head = self._slots.popleft()
            self.finished.append(head.record.offset)
            self.commit_offset = head.record.offset + 1
            self._cursor -= 1
            moved = True
        return moved

    def failed(self, slot: Slot, now: float, backoff: Callable[[int], float]) -> float | None:
        """A transient failure: the record goes back in line. The first failure while the
        partition flowed, and a failed probe, block it for `backoff(attempt)` (attempt = the
        failures in a row before this one), returned; a record that was in flight alongside the
        one that failed first only waits its turn (None)."""
        self._finish(slot)
        self._requeue(slot)
        if self.probing and slot is not self.probe:
            return None
        delay = backoff(self.failures)
        self.probe = None
        self.probing = True
        self.failures += 1
        self.blocked_until = now + delay
        return delay

    def not_posted(self, slot: Slot) -> None:
        """Handed out, then held back by may_post: it goes back in line, no attempt counted."""
        self._finish(slot)
        self._requeue(slot)
        if slot is self.probe:
            self.probe = None

    def _finish(self, slot: Slot) -> None:
        if slot.state is State.SENDING:
            self.in_flight -= 1

    def _requeue(self, slot: Slot) -> None:
        slot.state = State.PENDING
        heapq.heappush(self._again, slot)

    # -- the commit check -----------------------------------------------------------------------
    def unaccounted(self, base: int) -> tuple[int, int] | None:
        """A hole between `base` (the last commit) and the commit point that is neither done nor
        the broker's own; None when the commit point may be committed."""
        return unaccounted(base, self.finished, self.broker_holes)

    def committed(self, offset: int) -> None:
        """`offset` is committed: what the check read up to it is settled."""
        self.finished = [o for o in self.finished if o >= offset]
        self.broker_holes = {h for h in self.broker_holes if h[1] > offset}

    # -- introspection --------------------------------------------------------------------------
    def wait_s(self, now: float) -> float | None:
        """How long until a backoff ends (None when none is running)."""
        return self.blocked_until - now if now < self.blocked_until else None

    def connectors(self) -> set[str]:
        """Connectors this partition has sent to and not yet had an answer that finished the
        record: while it holds them, their failures count for readiness."""
        return {s.connector for s in self._slots if s.connector is not None}

    def sending(self) -> list[Slot]:
        return [s for s in self._slots if s.state is State.SENDING]
