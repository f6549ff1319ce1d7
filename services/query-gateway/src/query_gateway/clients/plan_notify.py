"""Early copies of plan replies on this gateway instance's own Redis channel
(docs/row-filters.md, "The reply channel").

The resolver publishes each reply on the channel the request named before it produces the Kafka
reply. A Redis subscriber is woken by the push at once, while a Kafka reader sees the reply only
at its next fetch — on a broker that sleeps out each fetch wait (the local Tansu) that is a few
milliseconds per miss. Nothing depends on this copy: a request names the channel only while the
subscription is up, and the Kafka reply is read as before, so a lost copy costs latency only.
Whichever copy arrives first answers; the other finds its request already answered."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from dataplane_contracts.plans import redis_reply_channel
from dataplane_service_kit.logs import get_logger

log = get_logger("query_gateway.plans")

RESUBSCRIBE_BACKOFF_S = (0.2, 0.5, 1.0, 2.0, 5.0)
POLL_S = 1.0  # how long one read waits for a message; nothing is sent while it waits


class ReplyChannel:
    def __init__(self, redis: aioredis.Redis, on_reply: Callable[[bytes], object]) -> None:
        self._redis = redis
        self._on_reply = on_reply
        self.channel = redis_reply_channel(uuid.uuid4().hex)
        self.live = False  # whether requests may name the channel now
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="plan-reply-channel")

    async def stop(self) -> None:
        # redis-py's get_message can swallow a cancellation that lands while it reads, so the
        # reader also checks a flag after each poll and the wait for it is bounded: a shutdown
        # that waited on a cancellation which never arrived hung the whole gateway
        self.live = False
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait({self._task}, timeout=POLL_S + 1.0)

    async def _run(self) -> None:
        failures = 0
        while not self._stopping:
            pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self.channel)
                self.live, failures = True, 0
                while not self._stopping:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=POLL_S)
                    if message is not None and isinstance(message.get("data"), bytes):
                        self._on_reply(message["data"])
            except (RedisError, OSError) as exc:
                # the Kafka replies still arrive: only the early copies pause until resubscribed
                log.warning("plan_reply_channel_lost", error=type(exc).__name__)
            finally:
                self.live = False
                with contextlib.suppress(Exception):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]
            if self._stopping:
                return
            await asyncio.sleep(RESUBSCRIBE_BACKOFF_S[min(failures, len(RESUBSCRIBE_BACKOFF_S) - 1)])
            failures += 1
