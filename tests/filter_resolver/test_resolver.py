"""The resolve phase around the handlers: the claim check, the key verification, RF-07's cache
(keys, None vs [] principals, TTLs, one-shot plans) and identical requests in flight."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from dataplane_contracts.plans import redis_claim_key, redis_one_shot_key, redis_plan_key
from dataplane_local.infra import free_port
from dataplane_testing.polling import eventually
from dataplane_testing.resolver import (
    cache_key_of,
    claim,
    make_settings,
    person,
    put_claim,
    read_plan,
    service_account,
)
from filter_resolver.app import open_runtime
from filter_resolver.handlers.plugins import PluginHandler
from filter_resolver.metrics import Metrics

ARGS = {"column": "sensor_id"}


class KeyedPlugin:
    """Narrows to the values of its keys: two consents differing only in keys differ here."""

    name = "keyed"

    async def resolve(self, *, table: str, args: dict[str, Any], keys: list[str], **_: Any) -> Any:
        from dataplane_contracts.plans import Plan

        return Plan.among(args["column"], sorted(k.split(":", 1)[1] for k in keys))


async def _gone(redis: Any, key: str) -> bool:
    return bool(await redis.exists(key) == 0)


# ---- the claim check ------------------------------------------------------------------------------


async def test_missing_claim_check_is_unavailable_not_empty(harness: Any) -> None:
    request = await put_claim(harness.redis, claim("rec_registry", ARGS))
    await harness.redis.delete(redis_claim_key(request.claim_check_id))
    reply = await harness.runtime.resolver.process(request)
    assert (reply.outcome, reply.error_code) == ("error", "row_filter_unavailable")
    assert await harness.redis.exists(redis_plan_key(request.cache_key)) == 0


async def test_expired_claim_check_is_unavailable(harness: Any, fresh_doubles: Any) -> None:
    request = await put_claim(
        harness.redis, claim("rec_registry", ARGS, caller=service_account(fresh_doubles.issuer))
    )
    await harness.redis.pexpire(redis_claim_key(request.claim_check_id), 1)
    key = redis_claim_key(request.claim_check_id)
    assert await eventually(lambda: _gone(harness.redis, key))
    reply = await harness.runtime.resolver.process(request)
    assert reply.error_code == "row_filter_unavailable"


async def test_claim_check_is_taken_once(harness: Any, fresh_doubles: Any) -> None:
    fresh_doubles.endpoint.reset((200, ["m-1"]))
    args = {"column": "meter_id", "url": fresh_doubles.endpoint_url + "/allowed"}
    request = await put_claim(
        harness.redis, claim("http_in_list", args, caller=person(fresh_doubles.issuer, "al"))
    )
    first = await harness.runtime.resolver.process(request)
    assert first.outcome == "cached"
    assert await harness.redis.exists(redis_claim_key(request.claim_check_id)) == 0
    # the same request read again (its first reply was never published): the claim is not
    # there to take, the plan it produced answers, and the upstream is not asked twice
    again = await harness.runtime.resolver.process(request)
    assert (again.outcome, again.cache_key) == ("cached", request.cache_key)
    assert len(fresh_doubles.endpoint.calls()) == 1
    # once that plan is gone too, the request is an error, never an empty input
    await harness.redis.delete(redis_plan_key(request.cache_key))
    third = await harness.runtime.resolver.process(request)
    assert (third.outcome, third.error_code) == ("error", "row_filter_unavailable")


async def test_unreadable_claim_check_is_invalid(harness: Any) -> None:
    request = await put_claim(harness.redis, claim("rec_registry", ARGS))
    await harness.redis.set(redis_claim_key(request.claim_check_id), b'{"handler": 1, "secret": "x"}')
    reply = await harness.runtime.resolver.process(request)
    assert (reply.error_code, reply.error_detail) == ("row_filter_invalid", "the claim check is unreadable")


async def test_forged_cache_key_is_invalid_and_writes_nothing(harness: Any, fresh_doubles: Any) -> None:
    mine = claim("rec_registry", ARGS, caller=service_account(fresh_doubles.issuer))
    victim_key = cache_key_of(claim("rec_registry", ARGS, caller=person(fresh_doubles.issuer, "victim")))
    request = await put_claim(harness.redis, mine, cache_key=victim_key)
    reply = await harness.runtime.resolver.process(request)
    assert (reply.outcome, reply.error_code) == ("error", "row_filter_invalid")
    assert await harness.redis.exists(redis_plan_key(victim_key), redis_plan_key(cache_key_of(mine))) == 0


async def test_key_under_another_secret_is_invalid(harness: Any, fresh_doubles: Any) -> None:
    check = claim("rec_registry", ARGS, caller=service_account(fresh_doubles.issuer))
    request = await put_claim(
        harness.redis, check, cache_key=cache_key_of(check, "another-secret-0123456789")
    )
    assert (await harness.runtime.resolver.process(request)).error_code == "row_filter_invalid"


async def test_unknown_handler_is_unenforceable(harness: Any, fresh_doubles: Any) -> None:
    reply = await harness.resolve(claim("no_such_handler", ARGS, caller=person(fresh_doubles.issuer, "al")))
    assert (reply.outcome, reply.error_code) == ("error", "row_filter_unenforceable")
    assert "no_such_handler" in (reply.error_detail or "")


async def test_deadline_passed_is_unavailable(harness: Any, fresh_doubles: Any) -> None:
    request = await put_claim(
        harness.redis, claim("rec_registry", ARGS, caller=service_account(fresh_doubles.issuer))
    )
    late = request.model_copy(update={"deadline": datetime.now(UTC) - timedelta(seconds=1)})
    assert (await harness.runtime.resolver.process(late)).error_code == "row_filter_unavailable"


# ---- RF-07 --------------------------------------------------------------------------------------


async def test_rf07_requests_differing_only_in_keys_never_share_a_plan(make_harness: Any) -> None:
    async with make_harness(plugins=[PluginHandler(KeyedPlugin())]) as h:
        a = claim("keyed", {"column": "pod"}, principals=(), keys=("pod:IT-A",))
        b = claim("keyed", {"column": "pod"}, principals=(), keys=("pod:IT-B",))
        assert cache_key_of(a) != cache_key_of(b)
        plan_a, plan_b = await h.plan(a), await h.plan(b)
        assert (plan_a.values, plan_b.values) == (("IT-A",), ("IT-B",))
        # the first plan is still there, unchanged, under its own key
        assert await read_plan(h.redis, await h.resolve(a)) == plan_a


async def test_rf07_none_and_empty_principals_never_share_a_plan(harness: Any, fresh_doubles: Any) -> None:
    caller = service_account(fresh_doubles.issuer)
    absent = claim("rec_registry", ARGS, caller=caller, principals=None)
    empty = claim("rec_registry", ARGS, caller=caller, principals=())
    assert cache_key_of(absent) != cache_key_of(empty)
    assert (await harness.plan(absent)).kind == "all"
    assert (await harness.plan(empty)).kind == "deny"
    assert (await harness.plan(absent)).kind == "all"


async def test_rf07_default_ttl(harness: Any, fresh_doubles: Any) -> None:
    check = claim("rec_registry", ARGS, caller=service_account(fresh_doubles.issuer))
    reply = await harness.resolve(check)
    assert reply.outcome == "cached"
    assert 290 <= await harness.redis.ttl(redis_plan_key(reply.cache_key)) <= 300


async def test_rf07_ttl_shortened_to_ds_cache_ttl(harness: Any, fresh_doubles: Any) -> None:
    check = claim("rec_registry", ARGS, caller=service_account(fresh_doubles.issuer), ds_cache_ttl=7)
    reply = await harness.resolve(check)
    assert 1 <= await harness.redis.ttl(redis_plan_key(reply.cache_key)) <= 7


async def test_rf07_ttl_shortened_to_token_lifetime(harness: Any, fresh_doubles: Any) -> None:
    caller = service_account(fresh_doubles.issuer).model_copy(update={"token_exp": int(time.time()) + 40})
    reply = await harness.resolve(claim("rec_registry", ARGS, caller=caller))
    assert 30 <= await harness.redis.ttl(redis_plan_key(reply.cache_key)) <= 40


async def test_rf07_plan_expires_at_the_shortened_ttl(harness: Any, fresh_doubles: Any) -> None:
    check = claim("rec_registry", ARGS, caller=service_account(fresh_doubles.issuer), ds_cache_ttl=1)
    reply = await harness.resolve(check)
    key = redis_plan_key(reply.cache_key)
    assert await harness.redis.exists(key) == 1
    assert await eventually(lambda: _gone(harness.redis, key), timeout=5)


async def test_rf07_zero_ttl_is_one_shot(harness: Any, fresh_doubles: Any) -> None:
    caller = service_account(fresh_doubles.issuer).model_copy(update={"token_exp": int(time.time()) - 5})
    reply = await harness.resolve(claim("rec_registry", ARGS, caller=caller))
    assert reply.outcome == "one_shot"
    assert reply.one_shot_id is not None
    assert await harness.redis.exists(redis_plan_key(reply.cache_key)) == 0
    assert 1 <= await harness.redis.ttl(redis_one_shot_key(reply.one_shot_id)) <= 30
    assert (await read_plan(harness.redis, reply)).kind == "all"
    assert await harness.redis.exists(redis_one_shot_key(reply.one_shot_id)) == 0  # read once


async def test_rf07_ds_cache_ttl_zero_is_one_shot(harness: Any, fresh_doubles: Any) -> None:
    check = claim(
        "rec_registry", ARGS, caller=service_account(fresh_doubles.issuer), principals=(), ds_cache_ttl=0
    )
    reply = await harness.resolve(check)
    assert reply.outcome == "one_shot"
    assert (await read_plan(harness.redis, reply)).kind == "deny"


# ---- identical requests in flight ------------------------------------------------------------------


async def test_identical_requests_in_flight_resolve_once(harness: Any, fresh_doubles: Any) -> None:
    fresh_doubles.registry.set_member("al", [{"key": "a", "sensor_id": "POD-1"}])
    fresh_doubles.registry.set_fault(endpoint="user_assets", status=None, delay_seconds=0.3, count=1)
    check = claim("rec_registry", ARGS, caller=person(fresh_doubles.issuer, "al"))
    requests = [await put_claim(harness.redis, check) for _ in range(3)]
    replies = await asyncio.gather(*(harness.runtime.resolver.process(r) for r in requests))
    assert [r.outcome for r in replies] == ["cached"] * 3
    assert [r.correlation_id for r in replies] == [r.correlation_id for r in requests]
    assert len(fresh_doubles.registry.calls("user_assets")) == 1
    assert harness.metrics.registry.get_sample_value("filter_resolver_coalesced_total") == 2


async def test_identical_one_shot_requests_each_get_their_own_plan(harness: Any, fresh_doubles: Any) -> None:
    fresh_doubles.registry.set_member("al", [{"key": "a", "sensor_id": "POD-1"}])
    fresh_doubles.registry.set_fault(endpoint="user_assets", status=None, delay_seconds=0.3, count=1)
    caller = person(fresh_doubles.issuer, "al").model_copy(update={"token_exp": int(time.time()) - 1})
    check = claim("rec_registry", ARGS, caller=caller)
    requests = [await put_claim(harness.redis, check) for _ in range(2)]
    replies = await asyncio.gather(*(harness.runtime.resolver.process(r) for r in requests))
    assert [r.outcome for r in replies] == ["one_shot", "one_shot"]
    assert replies[0].one_shot_id != replies[1].one_shot_id
    plans = [await read_plan(harness.redis, r) for r in replies]
    assert [p.values for p in plans] == [("POD-1",), ("POD-1",)]
    assert len(fresh_doubles.registry.calls("user_assets")) == 1


async def test_identical_requests_share_an_error(harness: Any, fresh_doubles: Any) -> None:
    fresh_doubles.registry.set_fault(endpoint="user_assets", status=401, delay_seconds=0.2)
    check = claim("rec_registry", ARGS, caller=person(fresh_doubles.issuer, "al"))
    requests = [await put_claim(harness.redis, check) for _ in range(2)]
    replies = await asyncio.gather(*(harness.runtime.resolver.process(r) for r in requests))
    assert [r.error_code for r in replies] == ["row_filter_unavailable"] * 2
    assert len(fresh_doubles.registry.calls("user_assets")) == 1


# ---- Redis --------------------------------------------------------------------------------------------


async def test_redis_unreachable_is_unready_and_unavailable(fresh_doubles: Any) -> None:
    settings = make_settings(redis_url=f"redis://127.0.0.1:{free_port()}/0")
    runtime = open_runtime(settings, Metrics(), [])
    try:
        try:
            ready = await runtime.checks()["redis"]()
        except Exception:
            ready = False
        assert ready is False
        from dataplane_contracts.events import PlanRequest

        request = PlanRequest(
            cache_key="0" * 64,
            claim_check_id=uuid.uuid4().hex,
            correlation_id=uuid.uuid4().hex,
            reply_topic="r",
            deadline=datetime.now(UTC) + timedelta(seconds=5),
        )
        reply = await runtime.resolver.process(request)
        assert reply.error_code == "row_filter_unavailable"
    finally:
        await runtime.aclose()


async def test_metrics_by_handler_and_outcome_without_personal_labels(
    harness: Any, fresh_doubles: Any
) -> None:
    al = person(fresh_doubles.issuer, "metric-al")
    await harness.resolve(claim("rec_registry", ARGS, caller=service_account(fresh_doubles.issuer)))
    await harness.resolve(claim("http_in_list", {"column": "c"}, caller=al))  # invalid: no url
    registry = harness.metrics.registry
    sample = registry.get_sample_value
    assert (
        sample(
            "filter_resolver_resolutions_total",
            {"handler": "rec_registry", "outcome": "cached", "error_code": "", "plan": "all"},
        )
        == 1
    )
    assert (
        sample(
            "filter_resolver_resolutions_total",
            {
                "handler": "http_in_list",
                "outcome": "error",
                "error_code": "row_filter_invalid",
                "plan": "none",
            },
        )
        == 1
    )
    assert sample("filter_resolver_cache_writes_total", {"kind": "plan"}) == 1
    assert sample("filter_resolver_resolution_seconds_count", {"handler": "rec_registry"}) == 1
    labels = {v for metric in registry.collect() for s in metric.samples for v in s.labels.values()}
    assert not labels & {al.sub, al.username, al.email, al.token}
