"""The resolve phase: claim check in, plan into the cache, a typed reply out.

One request: take the claim check with GETDEL (gone → error, never an empty input), verify that
it hashes to the request's cache key (a forged request must not write a plan under another
key), resolve through the named handler with bounded retries, write the plan under the RF-07 key
with its TTL — or, when the TTL is ≤ 0, under a one-shot key — and answer with where it is.
Identical requests in flight (same cache key) share one resolution; each still gets its own
write, so a one-shot plan is never handed to two readers."""

from __future__ import annotations

import asyncio
import hmac
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TypeVar

from opentelemetry import trace
from pydantic import ValidationError
from redis.asyncio import Redis
from redis.exceptions import RedisError

from dataplane_contracts.events import PlanReplyCopy, PlanRequest, PlanResolved
from dataplane_contracts.plans import (
    ONE_SHOT_TTL_SECONDS,
    ClaimCheck,
    Plan,
    plan_cache_key,
    plan_ttl,
    redis_claim_key,
    redis_one_shot_key,
    redis_plan_key,
)
from dataplane_service_kit.logs import get_logger
from filter_resolver.errors import ResolveError, invalid, unavailable, unenforceable
from filter_resolver.handlers.base import Handler, refuse_delegation
from filter_resolver.metrics import Metrics
from filter_resolver.registry import HandlerRegistry
from filter_resolver.retry import RetriesExhausted, with_retries

log = get_logger(__name__)
tracer = trace.get_tracer("filter_resolver")
T = TypeVar("T")


class Resolver:
    def __init__(
        self,
        *,
        redis: Redis,
        registry: HandlerRegistry,
        secret: bytes,
        default_ttl: int,
        retry_attempts: int,
        retry_base_ms: int,
        metrics: Metrics,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._redis = redis
        self._registry = registry
        self._secret = secret
        self._default_ttl = default_ttl
        self._attempts = retry_attempts
        self._base_ms = retry_base_ms
        self._metrics = metrics
        self._clock = clock
        self._inflight: dict[str, asyncio.Future[Plan]] = {}

    async def process(self, request: PlanRequest) -> PlanResolved:
        started = time.perf_counter()
        label = "unknown"
        plan: Plan | None = None
        copied = False  # whether the early copy went out with the plan's write
        with tracer.start_as_current_span("row_filter.resolve") as span:
            try:
                claim = await self._timed("claim", self._take_claim(request))
                if claim is None:
                    reply = await self._answer_from_cache(request)
                else:
                    self._verify(claim, request)
                    handler = self._registry.get(claim.handler)
                    if handler is None:
                        raise unenforceable(f"unknown row filter handler {claim.handler!r}")
                    label = handler.name
                    span.set_attribute("row_filter.handler", label)
                    plan = await self._timed("resolve", self._resolve_once(request, handler, claim))
                    reply = await self._timed("store", self._store(request, claim, plan))
                    copied = request.reply_channel is not None and reply.outcome == "cached"
            except ResolveError as exc:
                span.set_attribute("row_filter.error", exc.code)
                log.info("plan_request_refused", handler=label, error=exc.code, detail=exc.detail)
                reply = PlanResolved(
                    correlation_id=request.correlation_id,
                    cache_key=request.cache_key,
                    outcome="error",
                    error_code=exc.code,
                    error_detail=exc.detail,
                )
            span.set_attribute("row_filter.outcome", reply.outcome)
            if request.reply_channel is not None and not copied:
                await self.notify(request.reply_channel, PlanReplyCopy(reply=reply))
        kind = plan.kind if plan is not None and reply.outcome != "error" else "none"
        self._metrics.resolutions.labels(label, reply.outcome, reply.error_code or "", kind).inc()
        self._metrics.latency.labels(label).observe(time.perf_counter() - started)
        return reply

    async def _timed(self, hop: str, step: Awaitable[T]) -> T:
        """One hop's time into filter_resolver_hop_seconds, whatever its outcome."""
        started = time.perf_counter()
        try:
            return await step
        finally:
            self._metrics.hops.labels(hop).observe(time.perf_counter() - started)

    # -- the claim check ------------------------------------------------------------------------
    async def _take_claim(self, request: PlanRequest) -> ClaimCheck | None:
        """The claim check, taken (GETDEL); None when it is gone."""
        try:
            raw = await self._redis.getdel(redis_claim_key(request.claim_check_id))
        except RedisError:
            raise unavailable("the claim-check store is unreachable") from None
        if raw is None:
            return None
        try:
            return ClaimCheck.model_validate_json(raw)
        except ValidationError:
            # the validation message quotes the input, which is personal data: never rendered
            raise invalid("the claim check is unreadable") from None

    async def _answer_from_cache(self, request: PlanRequest) -> PlanResolved:
        """A request whose claim check is gone. When a plan is cached under its key, that plan
        answers it: the usual case is this very request read a second time because its first
        reply could not be published (the consumer commits only after publishing, and the first
        reading took the claim), or an identical request resolved first. The plan was written by
        a resolution whose claim hashed to this key (RF-07), so it is the plan for these inputs;
        the reply names the key only, which the asker already holds. With no plan the claim has
        expired: an error, never an empty input."""
        try:
            cached = await self._redis.exists(redis_plan_key(request.cache_key))
        except RedisError:
            raise unavailable("the plan cache is unreachable") from None
        if not cached:
            raise unavailable("the claim check has expired or is missing")
        log.info("plan_request_answered_from_cache")
        return PlanResolved(
            correlation_id=request.correlation_id, cache_key=request.cache_key, outcome="cached"
        )

    def _verify(self, claim: ClaimCheck, request: PlanRequest) -> None:
        expected = plan_cache_key(claim.key_inputs(), self._secret)
        if not hmac.compare_digest(expected, request.cache_key):
            raise invalid("the claim check does not match the request's cache key")

    # -- resolution, once per cache key in flight ------------------------------------------------
    async def _resolve_once(self, request: PlanRequest, handler: Handler, claim: ClaimCheck) -> Plan:
        key = request.cache_key
        running = self._inflight.get(key)
        if running is not None:
            self._metrics.coalesced.inc()
            return await asyncio.shield(running)
        future: asyncio.Future[Plan] = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            plan = await self._resolve(request, handler, claim)
        except BaseException as exc:
            failure = exc if isinstance(exc, ResolveError) else unavailable("resolution was interrupted")
            future.set_exception(failure)
            future.exception()  # retrieved here, so a future nobody else awaited does not warn
            raise
        else:
            future.set_result(plan)
            return plan
        finally:
            del self._inflight[key]

    async def _resolve(self, request: PlanRequest, handler: Handler, claim: ClaimCheck) -> Plan:
        remaining = (request.deadline - datetime.now(UTC)).total_seconds()
        if remaining <= 0:
            raise unavailable("the request's deadline has passed")
        refuse_delegation(claim)

        def on_retry(attempt: int, exc: BaseException) -> None:
            self._metrics.retries.labels(handler.name).inc()
            log.info("resolve_retry", handler=handler.name, attempt=attempt, error=type(exc).__name__)

        try:
            async with asyncio.timeout(remaining):
                return await with_retries(
                    lambda: handler.resolve(claim), self._attempts, self._base_ms, on_retry
                )
        except ResolveError:
            raise
        except RetriesExhausted as exc:
            log.warning(
                "resolve_unavailable",
                handler=handler.name,
                attempts=exc.attempts,
                error=type(exc.last).__name__,
            )
            raise unavailable(f"{handler.name}: upstream unavailable after {exc.attempts} attempts") from None
        except TimeoutError:
            raise unavailable(f"{handler.name}: the request's deadline passed while resolving") from None
        except Exception as exc:
            # exception text may quote a URL or an upstream body: only its type is logged
            log.error("resolve_failed", handler=handler.name, error=type(exc).__name__)
            raise unavailable(f"{handler.name}: resolution failed") from None

    async def notify(self, channel: str, copy: PlanReplyCopy) -> None:
        """An early copy of the reply on the asker's Redis channel: the gateway wakes on it instead
        of waiting for its next Kafka fetch. Best effort by design — the Kafka reply published next
        is the copy that is never lost, so a failure here costs latency, not an answer."""
        started = time.perf_counter()
        try:
            await self._redis.publish(channel, copy.model_dump_json())
        except RedisError as exc:
            log.warning("plan_reply_notify_failed", error=type(exc).__name__)
        finally:
            self._metrics.hops.labels("notify").observe(time.perf_counter() - started)

    # -- the plan cache (RF-07) -----------------------------------------------------------------
    async def _store(self, request: PlanRequest, claim: ClaimCheck, plan: Plan) -> PlanResolved:
        token_exp = claim.caller.token_exp if claim.caller else None
        ttl = plan_ttl(self._default_ttl, claim.ds_cache_ttl, token_exp, self._clock())
        data = plan.model_dump_json()
        try:
            if ttl > 0:
                outcome = PlanResolved(
                    correlation_id=request.correlation_id, cache_key=request.cache_key, outcome="cached"
                )
                async with self._redis.pipeline(transaction=False) as pipe:
                    pipe.set(redis_plan_key(request.cache_key), data, ex=ttl)
                    if request.reply_channel is not None:
                        # the early copy right behind the write, in the same round trip; a failed
                        # PUBLISH alone is not an error (the Kafka reply follows), a failed SET is
                        copy = PlanReplyCopy(reply=outcome, plan=plan, ttl_seconds=ttl)
                        pipe.publish(request.reply_channel, copy.model_dump_json())
                    results = await pipe.execute(raise_on_error=False)
                if isinstance(results[0], Exception):
                    raise results[0]
                if len(results) > 1 and isinstance(results[1], Exception):
                    log.warning("plan_reply_notify_failed", error=type(results[1]).__name__)
                self._metrics.cache_writes.labels("plan").inc()
            else:
                one_shot = uuid.uuid4().hex
                await self._redis.set(redis_one_shot_key(one_shot), data, ex=ONE_SHOT_TTL_SECONDS)
                self._metrics.cache_writes.labels("one_shot").inc()
                outcome = PlanResolved(
                    correlation_id=request.correlation_id,
                    cache_key=request.cache_key,
                    outcome="one_shot",
                    one_shot_id=one_shot,
                )
        except RedisError:
            raise unavailable("the plan cache is unreachable") from None
        log.info(
            "plan_resolved",
            handler=claim.handler,
            kind=plan.kind,
            count=plan.meta.count,
            ttl=ttl,
            outcome=outcome.outcome,
        )
        return outcome
