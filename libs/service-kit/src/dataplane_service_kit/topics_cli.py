"""`dataplane-topics create|list`: create every topic with its partitions and configuration,
idempotently, on any Kafka-protocol broker (local stack, tests, Helm hook Job).

Here and not in the contracts, which list the topics (dataplane_contracts.topics) but pull no
Kafka client: this is the code that talks to a broker, run from any service's image."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from dataplane_contracts.topics import TopicSpec, topic_specs


async def create_topics(bootstrap: str, specs: list[TopicSpec], timeout_s: float = 30.0) -> list[str]:
    """Create what is missing; returns the names created. Existing topics are left as they are."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout_s * 1000))
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [s for s in specs if s.name not in existing]
        if missing:
            # config is applied where the broker honours it; the replication factor is 1 unless
            # KAFKA_REPLICATION_FACTOR says otherwise (the Helm hook Job sets 3 for production)
            rf = replication_factor()
            new = [NewTopic(s.name, s.partitions, rf, topic_configs=s.config) for s in missing]
            await admin.create_topics(new)
        return [s.name for s in missing]
    finally:
        await admin.close()


def replication_factor() -> int:
    return int(os.environ.get("KAFKA_REPLICATION_FACTOR", "1"))


def _parse_partitions(items: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        name, _, count = item.partition("=")
        out[name] = int(count)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dataplane-topics")
    parser.add_argument("command", choices=["create", "list"])
    parser.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS"))
    parser.add_argument("--partitions", action="append", default=[], help="topic=N, repeatable")
    args = parser.parse_args(argv)
    if not args.bootstrap:
        print("invalid configuration: KAFKA_BOOTSTRAP_SERVERS is required", file=sys.stderr)
        return 2
    specs = topic_specs(_parse_partitions(args.partitions))
    if args.command == "list":
        for s in specs:
            print(f"{s.name}\t{s.partitions}\t{s.config}")
        return 0
    created = asyncio.run(create_topics(args.bootstrap, specs))
    print(f"created: {', '.join(created) or 'none (all exist)'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
