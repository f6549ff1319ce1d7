"""The long poll of a change session (`wait=<s>`, docs/records.md, "Waiting for changes"): an
answer that would be empty waits — holding no database connection — until the dataset's
watcher sees a change past the session's horizon, or the time is up, and then the whole request
is read again from its start: the pull token and its flow (STARTED, not expired or revoked), the
token, ds's verdict, both row-filter layers and the visibility context, every one of them checked
again before anything is delivered, and a refusal of any is the answer."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from query_gateway.records.changes import Pending
from query_gateway.records.watch import ChangeWatchers

Read = Callable[[bool], Awaitable[dict[str, object] | Pending]]


async def polled(watchers: ChangeWatchers | None, read: Read) -> dict[str, object]:
    """`read(final)`: the request read once; not final, an empty answer comes back Pending."""
    answer = await read(watchers is None)
    if not isinstance(answer, Pending):
        return answer
    assert watchers is not None
    clock = asyncio.get_running_loop().time
    deadline = clock() + answer.wait_s
    while isinstance(answer, Pending):
        woken = await watchers.wait(answer.table, answer.column, answer.since, deadline - clock())
        answer = await read(not woken or clock() >= deadline)
    return answer
