"""Two real `filter-resolver` processes in one consumer group, through the real broker: replies
on the reply topic (to the named partition), partitions shared, offsets committed, and RF-08 —
at DEBUG, nothing personal in any log line, message, error, metric or plan meta.

The processes start once for the module: a group join costs ~3 s on the local broker."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from redis.asyncio import Redis

from dataplane_contracts.events import PlanResolved
from dataplane_contracts.plans import Plan, redis_plan_key
from dataplane_testing.polling import eventually
from dataplane_testing.processes import ServiceProcess
from dataplane_testing.resolver import (
    CLIENT_ID,
    CLIENT_SECRET,
    PARTITIONS,
    Gateway,
    claim,
    gateway,
    module_topics,
    person,
    put_claim,
    read_plan,
    render,
    resolver_env,
    service_account,
    start_resolver,
)
from dataplane_testing.topics import make_topics, read_to_end
from filter_resolver.settings import GROUP_ID

pytestmark = pytest.mark.e2e


@dataclass
class Stack:
    resolvers: list[ServiceProcess]
    gateway: Gateway
    redis: Redis
    bootstrap: str
    request_topic: str
    reply_topic: str


@pytest.fixture(scope="module")
async def stack(
    kafka_bootstrap: str, redis_server_url: str, doubles: Any, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    suffix = uuid.uuid4().hex[:8]
    specs, request_topic, reply_topic = module_topics(suffix)
    await make_topics(kafka_bootstrap, specs)
    workdir: Path = tmp_path_factory.mktemp("resolvers")
    env = resolver_env(
        kafka_bootstrap,
        redis_server_url,
        request_topic,
        CELINE_OIDC_BASE_URL=doubles.issuer.base_url,
        CELINE_OIDC_CLIENT_ID=CLIENT_ID,
        CELINE_OIDC_CLIENT_SECRET=CLIENT_SECRET,
        REC_REGISTRY_URL=doubles.registry_url,
        RESOLVER_RETRY_BASE_MS="5",
        LOG_LEVEL="DEBUG",
    )
    resolvers = [start_resolver(env, workdir, f"resolver-{i}") for i in range(2)]
    redis = Redis.from_url(redis_server_url)
    try:
        async with gateway(kafka_bootstrap, request_topic, reply_topic) as gw:
            stack = Stack(resolvers, gw, redis, kafka_bootstrap, request_topic, reply_topic)

            async def settled() -> bool:
                # both ready and, after the rebalance, every partition held by exactly one member
                if not all([await r.ready() for r in resolvers]):
                    return False
                held = [await r.metric("filter_resolver_assigned_partitions") for r in resolvers]
                return sum(held) == PARTITIONS and all(h > 0 for h in held)

            if not await eventually(settled, timeout=60, interval=0.2):
                logs = "\n".join(r.stderr()[-3000:] for r in resolvers)
                pytest.fail(f"the resolvers did not share the partitions:\n{logs}")
            yield stack
    finally:
        for r in resolvers:
            r.stop()
        await redis.aclose()


async def test_healthz_and_readyz(stack: Stack) -> None:
    import httpx

    async with httpx.AsyncClient() as client:
        for r in stack.resolvers:
            assert (await client.get(r.url + "/healthz")).json() == {"status": "ok"}
            assert (await client.get(r.url + "/readyz")).json() == {"status": "ready"}


async def test_request_gets_its_reply_on_the_reply_topic(stack: Stack, fresh_doubles: Any) -> None:
    check = claim("rec_registry", {"column": "sensor_id"}, caller=service_account(fresh_doubles.issuer))
    request = await put_claim(stack.redis, check, reply_topic=stack.reply_topic, reply_partition=4)
    trace_id = uuid.uuid4().hex
    await stack.gateway.send(request, headers=[("traceparent", f"00-{trace_id}-{'1' * 16}-01".encode())])
    record = await stack.gateway.reply(request.correlation_id)
    # the trace continues: the reply carries the request's trace id
    assert trace_id in dict(record.headers)["traceparent"].decode()
    assert (record.topic, record.partition) == (stack.reply_topic, 4)
    assert record.key == request.correlation_id.encode()
    assert ("correlation_id", request.correlation_id.encode()) in list(record.headers)
    reply = PlanResolved.model_validate_json(record.value)
    assert (reply.outcome, reply.cache_key) == ("cached", request.cache_key)
    assert (await read_plan(stack.redis, reply)).kind == "all"


async def test_two_processes_in_one_group_share_the_partitions(stack: Stack, fresh_doubles: Any) -> None:
    held = [await r.metric("filter_resolver_assigned_partitions") for r in stack.resolvers]
    assert sum(held) == PARTITIONS and all(h > 0 for h in held)
    before = [await r.metric("filter_resolver_resolutions_total") for r in stack.resolvers]
    caller = service_account(fresh_doubles.issuer)
    requests = [
        await put_claim(
            stack.redis,
            claim("rec_registry", {"column": "c"}, table=f"t{i}", caller=caller),
            reply_topic=stack.reply_topic,
        )
        for i in range(24)
    ]
    for request in requests:
        await stack.gateway.send(request)
    replies = [await stack.gateway.reply(r.correlation_id) for r in requests]
    assert len(replies) == 24
    after = [await r.metric("filter_resolver_resolutions_total") for r in stack.resolvers]
    handled = [a - b for a, b in zip(after, before, strict=True)]
    assert sum(handled) == 24
    assert all(h > 0 for h in handled), handled  # both members answered requests


async def test_offsets_are_committed_after_the_replies(stack: Stack, fresh_doubles: Any) -> None:
    caller = service_account(fresh_doubles.issuer)
    request = await put_claim(
        stack.redis, claim("rec_registry", {"column": "c"}, caller=caller), reply_topic=stack.reply_topic
    )
    await stack.gateway.ask(request)
    tps = [TopicPartition(stack.request_topic, p) for p in range(PARTITIONS)]
    # a group member that never subscribes reads the committed offsets without joining
    reader = AIOKafkaConsumer(bootstrap_servers=stack.bootstrap, group_id=GROUP_ID, enable_auto_commit=False)
    await reader.start()
    try:

        async def all_committed() -> bool:
            ends = await reader.end_offsets(tps)
            committed = [await reader.committed(tp) or 0 for tp in tps]
            return committed == [ends[tp] for tp in tps]

        assert await eventually(all_committed, timeout=10)
    finally:
        await reader.stop()


async def test_unreadable_request_is_answered_when_it_names_a_correlation_id(stack: Stack) -> None:
    cid, key = uuid.uuid4().hex, "ab" * 32
    raw = f'{{"correlation_id": "{cid}", "cache_key": "{key}", "reply_topic": "{stack.reply_topic}"}}'
    await stack.gateway.send_raw(raw.encode())
    record = await stack.gateway.reply(cid)
    reply = PlanResolved.model_validate_json(record.value)
    assert (reply.outcome, reply.error_code) == ("error", "row_filter_invalid")


async def test_rf08_no_token_principal_or_key_leaves_the_plan_values(
    stack: Stack, fresh_doubles: Any
) -> None:
    tag = uuid.uuid4().hex[:6]
    alice = person(fresh_doubles.issuer, f"alice-{tag}", email=f"alice-{tag}@example.org")
    principals = (f"u-alice-{tag}", f"u-bob-{tag}")
    keys = (f"pod:IT-KEY-{tag}", f"pod:IT-OTHER-{tag}")
    fresh_doubles.registry.set_member(
        alice.username, [{"key": "m", "sensor_id": f"S-{tag}-1"}], user_id=principals[0]
    )
    fresh_doubles.registry.set_member(
        f"bob-{tag}", [{"key": "m", "sensor_id": f"S-{tag}-2"}], user_id=principals[1]
    )
    fresh_doubles.endpoint.reset((200, [f"M-{tag}"]))
    service = service_account(fresh_doubles.issuer)
    rec = {"column": "sensor_id"}
    http = {
        "column": "meter",
        "url": fresh_doubles.endpoint_url + "/u/{sub}",
        "forward_token": True,
        "params": {"u": "{username}", "e": "{email}"},
        "headers": {"x-t": "{token}"},
    }
    checks = [
        claim("rec_registry", rec, caller=alice),  # self-service
        claim("rec_registry", rec, caller=service, principals=principals, keys=keys),  # delegated
        claim("http_in_list", http, caller=alice),  # forward_token and every placeholder
        claim("http_in_list", http, caller=service, principals=principals, keys=keys),  # refused
        claim("rec_registry", rec, caller=person(fresh_doubles.issuer, f"carol-{tag}")),  # not a member
    ]
    replies = []
    for check in checks:
        request = await put_claim(stack.redis, check, reply_topic=stack.reply_topic)
        replies.append(await stack.gateway.ask(request))
    assert [r.outcome for r in replies] == ["cached", "cached", "cached", "error", "cached"]
    assert replies[3].error_code == "row_filter_unenforceable"
    plans = [await read_plan(stack.redis, r) for r in replies if r.outcome == "cached"]
    assert [p.values for p in plans] == [
        (f"S-{tag}-1",),
        (f"S-{tag}-1", f"S-{tag}-2"),
        (f"M-{tag}",),
        (),
    ]
    # the endpoint and the registry did receive the caller's values: the test can see a leak
    (seen,) = fresh_doubles.endpoint.calls()
    assert seen.headers["authorization"] == f"Bearer {alice.token}"
    (lookup,) = fresh_doubles.registry.calls("admin_lookup")
    service_token = lookup.headers["authorization"].removeprefix("Bearer ")

    secrets = {
        alice.token,
        alice.sub,
        alice.username,
        alice.email,
        service.token,
        service_token,
        *principals,
        *keys,
        *(k.split(":", 1)[1] for k in keys),
    }
    secrets = {s for s in secrets if s}
    logs = "\n".join(r.stderr() for r in stack.resolvers)
    assert '"level":"debug"' in logs.replace('": "', '":"')  # the capture really is at DEBUG
    messages = [
        render(rec)
        for rec in await read_to_end(
            stack.bootstrap, [stack.request_topic, stack.reply_topic], range(PARTITIONS)
        )
    ]
    assert len(messages) >= 2 * len(checks)
    metas = []
    for reply in replies:
        raw = await stack.redis.get(redis_plan_key(reply.cache_key))
        if raw is not None:
            metas.append(Plan.model_validate_json(raw).meta.model_dump_json())
    details = [r.error_detail or "" for r in replies]
    metrics = []
    import httpx

    async with httpx.AsyncClient() as client:
        for r in stack.resolvers:
            metrics.append((await client.get(r.url + "/metrics")).text)
    for secret in secrets:
        assert secret not in logs, f"a personal value is in the logs: {secret[:4]}…"
        for where, texts in (
            ("messages", messages),
            ("plan meta", metas),
            ("errors", details),
            ("metrics", metrics),
        ):
            assert not any(secret in t for t in texts), f"a personal value is in the {where}"
