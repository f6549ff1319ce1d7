"""The window's rules on their own (window.py): the commit point is the longest finished prefix, at
most `max_in_flight` records of a partition are out, and after a failure the lowest failed record
is retried alone before anything else of the partition is sent. The relay-level tests prove the
same against a real broker and ds; these pin the edge cases down without timing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from audit_relay.window import Slot, State, Window


@dataclass
class _Record:
    offset: int
    topic: str = "t"
    partition: int = 0
    timestamp: int = 0
    key: bytes | None = None
    value: bytes | None = None
    headers: Sequence[tuple[str, bytes]] = ()


def _window(n: int, max_in_flight: int, first_offset: int = 0) -> Window:
    w = Window(max_in_flight)
    w.add([_Record(first_offset + i) for i in range(n)])
    return w


def _drain(w: Window, now: float = 0.0) -> list[Slot]:
    out = []
    while (slot := w.next_to_send(now)) is not None:
        out.append(slot)
    return out


def _no_backoff(attempt: int) -> float:
    return 1.0 + attempt


def test_at_most_max_in_flight_are_handed_out_and_the_window_slides_with_the_head() -> None:
    w = _window(10, max_in_flight=3)
    first = _drain(w)
    assert [s.record.offset for s in first] == [0, 1, 2]
    assert w.in_flight == 3
    # a later record finishing does not open the window: the head (0) is still out
    w.done(first[2])
    assert _drain(w) == []
    w.done(first[0])
    # the window is [1, 2, 3]: 2 is done, 1 in flight, so only 3 may go
    assert [s.record.offset for s in _drain(w)] == [3]


def test_rf10_commit_point_is_the_longest_finished_prefix_never_past_an_unfinished_record() -> None:
    w = _window(6, max_in_flight=6, first_offset=100)
    slots = _drain(w)
    assert w.commit_offset is None
    for i in (1, 2, 4, 5):  # everything but 100 and 103
        assert not w.done(slots[i])
        assert w.commit_offset is None  # 100 is not finished: nothing may be committed
    assert w.done(slots[0])
    assert w.commit_offset == 103  # 100..102 finished; 103 is not
    assert len(w) == 3  # 103, 104, 105 still held (104, 105 done, waiting behind 103)
    assert w.done(slots[3])
    assert w.commit_offset == 106
    assert len(w) == 0


def test_commit_point_follows_offsets_with_gaps() -> None:
    w = Window(4)
    w.add([_Record(o) for o in (7, 9, 12)])  # transaction markers or compaction leave gaps
    slots = _drain(w)
    w.done(slots[0])
    assert w.commit_offset == 8
    w.done(slots[2])
    assert w.commit_offset == 8
    w.done(slots[1])
    assert w.commit_offset == 13


def test_rf10_a_failure_blocks_the_partition_then_the_failed_record_is_retried_alone_first() -> None:
    w = _window(8, max_in_flight=4)
    out = _drain(w)
    assert [s.record.offset for s in out] == [0, 1, 2, 3]
    # 1 fails first: a backoff starts; 2 fails too (it was in flight beside it): it only waits
    assert w.failed(out[1], now=10.0, backoff=_no_backoff) == 1.0
    assert w.failed(out[2], now=10.1, backoff=_no_backoff) is None
    w.done(out[0])
    w.done(out[3])
    assert w.commit_offset == 1  # nothing past the failed record
    assert _drain(w, now=10.5) == []  # backing off
    # after the backoff: the lowest failed record goes alone
    probe = _drain(w, now=11.0)
    assert [s.record.offset for s in probe] == [1]
    # the probe fails again: a longer backoff, still nothing else sent
    assert w.failed(probe[0], now=11.2, backoff=_no_backoff) == 2.0
    assert _drain(w, now=12.0) == []
    (again,) = _drain(w, now=13.3)
    assert again is probe[0]
    # ds accepts the probe: the partition flows, the other failed record first, then the new ones
    w.done(again)
    assert w.commit_offset == 2
    assert [s.record.offset for s in _drain(w, now=13.4)] == [2, 4, 5]
    assert w.failures == 0 and not w.probing


def test_a_record_handed_out_before_a_failure_is_held_back_and_keeps_its_place() -> None:
    w = _window(4, max_in_flight=4)
    out = _drain(w)
    w.failed(out[0], now=0.0, backoff=_no_backoff)
    # 3 was waiting for a connector slot when 0 failed: it may not be posted now
    assert not w.may_post(out[3], now=0.5)
    w.not_posted(out[3])
    assert out[3].state is State.PENDING and out[3].attempts == 0
    w.done(out[1])
    w.done(out[2])
    (probe,) = _drain(w, now=5.0)
    assert probe is out[0]
    assert w.may_post(probe, now=5.0)
    w.done(probe)
    assert [s.record.offset for s in _drain(w, now=5.0)] == [3]


def test_max_in_flight_one_sends_strictly_in_order() -> None:
    w = _window(3, max_in_flight=1)
    order = []
    while (slot := w.next_to_send(0.0)) is not None:
        assert _drain(w) == []  # nothing else while one is out
        order.append(slot.record.offset)
        w.done(slot)
    assert order == [0, 1, 2]
