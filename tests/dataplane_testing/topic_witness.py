"""A reader of one topic in a process of its own, beside a burst: every record's `transfer_id`
that starts with a prefix, one per line, into a file, from given start offsets until it is sent
SIGTERM and has then been idle a moment.

Why a process, and why beside the burst: the local broker slows down on a long partition, and a
reader that starts after 100 000 records were written to one partition was handed none of them;
one in the test's own process fell behind its clients. Beside the burst, in its own process, it
reads near the head as the relay does.

    python -m dataplane_testing.topic_witness BOOTSTRAP TOPIC PREFIX STARTS_JSON OUT"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from pathlib import Path

from aiokafka import AIOKafkaConsumer, TopicPartition

IDLE_STOP_S = 2.0


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
        with out.open("a") as sink:
            while not (stopping.is_set() and time.monotonic() - last > IDLE_STOP_S):
                batch = await consumer.getmany(timeout_ms=200)
                for records in batch.values():
                    for record in records:
                        transfer = json.loads(record.value or b"{}").get("transfer_id")
                        if isinstance(transfer, str) and transfer.startswith(prefix):
                            sink.write(transfer + "\n")
                    if records:
                        last = time.monotonic()
                sink.flush()
    finally:
        await consumer.stop()


def main() -> None:
    bootstrap, topic, prefix, starts, out = sys.argv[1:6]
    positions = {int(p): int(o) for p, o in json.loads(starts).items()}
    asyncio.run(witness(bootstrap, topic, prefix, positions, Path(out)))


if __name__ == "__main__":
    main()
