"""A reader of one topic in a process of its own, beside a burst: every record's `transfer_id`
that starts with a prefix, one per line, into a file, from given start offsets until it is sent
SIGTERM and has then been idle a moment.

Why a process, and why beside the burst: the local broker slows down on a long partition, and a
reader that starts after 100 000 records were written to one partition was handed none of them;
one in the test's own process fell behind its clients. Beside the burst, in its own process, it
reads near the head as the relay does. Like the relay it does not take a jump as it comes: under
concurrent producers the local broker can hand a fetch a later batch before an earlier one (a
plain reader then misses the earlier one, seen: 4 of 100 000), so a record past the next offset
sends the reader back to that offset; a jump seen JUMP_SIGHTINGS times over JUMP_CONFIRM_S is
the broker's own hole and taken.

    python -m dataplane_testing.topic_witness BOOTSTRAP TOPIC PREFIX STARTS_JSON OUT"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from pathlib import Path
from typing import TextIO

from aiokafka import AIOKafkaConsumer, TopicPartition

IDLE_STOP_S = 2.0
JUMP_SIGHTINGS = 3
JUMP_CONFIRM_S = 5.0


async def witness(bootstrap: str, topic: str, prefix: str, starts: dict[int, int], out: Path) -> None:
    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, fetch_max_wait_ms=100
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in sorted(starts)]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, starts[tp.partition])
        last = time.monotonic()
        expected = dict(starts)
        jumps: dict[tuple[int, int], list[float]] = {}  # (partition, offset) -> when seen
        with out.open("a") as sink:
            while not (stopping.is_set() and time.monotonic() - last > IDLE_STOP_S):
                batch = await consumer.getmany(timeout_ms=200)
                for tp, records in batch.items():
                    for record in records:
                        want = expected[tp.partition]
                        if record.offset < want:
                            continue  # read again after a jump
                        if record.offset > want and not _confirmed(jumps, (tp.partition, want)):
                            consumer.seek(tp, want)
                            break
                        _take(record.value, prefix, sink)
                        expected[tp.partition] = record.offset + 1
                    if records:
                        last = time.monotonic()
                sink.flush()
    finally:
        await consumer.stop()


def _confirmed(jumps: dict[tuple[int, int], list[float]], at: tuple[int, int]) -> bool:
    now = time.monotonic()
    seen = [t for t in jumps.get(at, []) if now - t <= JUMP_CONFIRM_S * 2] + [now]
    jumps[at] = seen
    return len(seen) >= JUMP_SIGHTINGS and now - seen[0] >= JUMP_CONFIRM_S


def _take(value: bytes | None, prefix: str, sink: TextIO) -> None:
    transfer = json.loads(value or b"{}").get("transfer_id")
    if isinstance(transfer, str) and transfer.startswith(prefix):
        sink.write(transfer + "\n")


def main() -> None:
    bootstrap, topic, prefix, starts, out = sys.argv[1:6]
    positions = {int(p): int(o) for p, o in json.loads(starts).items()}
    asyncio.run(witness(bootstrap, topic, prefix, positions, Path(out)))


if __name__ == "__main__":
    main()
