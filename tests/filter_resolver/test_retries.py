"""Retries, then a loud failure (docs/row-filters.md, "Two phases"): a transient upstream failure
— a refused connection, a timeout, a 5xx — is retried, 3 attempts backing off from 20 ms and
doubling, both configurable; when every attempt fails the answer is `row_filter_unavailable`,
never a plan. The schedule is read from the settings and the retry module, not timed; attempts
are counted where they arrive (a TCP listener, an HTTP double) or, for a refused connection that
nothing can receive, by the resolver's own retry metric."""

from __future__ import annotations

from typing import Any

import pytest

from dataplane_testing.polling import eventually
from dataplane_testing.resolver import SECRET, TcpDouble, claim, person, refused_port
from filter_resolver.errors import TransientUpstream
from filter_resolver.retry import RetriesExhausted, backoff_delays, with_retries
from filter_resolver.settings import Settings


def _settings() -> Settings:
    # only what the service cannot start without; the retry settings keep their defaults
    return Settings(
        kafka_bootstrap_servers="127.0.0.1:1",
        redis_url="redis://127.0.0.1:1/0",
        row_filters_cache_key_secret=SECRET,
    )


def retries_of(harness: Any) -> float:
    value = harness.metrics.registry.get_sample_value(
        "filter_resolver_upstream_retries_total", {"handler": "http_in_list"}
    )
    return float(value or 0.0)


async def _failing_schedule(attempts: int, base_ms: int) -> tuple[int, list[float]]:
    """Run with_retries on an attempt that always fails transiently; the attempts made and the
    waits asked for, in order (the waits are recorded, not slept)."""
    tried = 0
    waits: list[float] = []

    async def attempt() -> None:
        nonlocal tried
        tried += 1
        raise TransientUpstream("endpoint answered 503")

    async def record(seconds: float) -> None:
        waits.append(seconds)

    with pytest.raises(RetriesExhausted) as failed:
        await with_retries(attempt, attempts, base_ms, sleep=record)
    assert failed.value.attempts == attempts
    return tried, waits


async def test_retry_defaults_are_3_attempts_from_20ms_doubling(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RESOLVER_RETRY_ATTEMPTS", "RESOLVER_RETRY_BASE_MS"):
        monkeypatch.delenv(name, raising=False)
    settings = _settings()
    assert (settings.resolver_retry_attempts, settings.resolver_retry_base_ms) == (3, 20)
    assert backoff_delays(settings.resolver_retry_attempts, settings.resolver_retry_base_ms) == (0.02, 0.04)
    tried, waits = await _failing_schedule(settings.resolver_retry_attempts, settings.resolver_retry_base_ms)
    assert (tried, waits) == (3, [0.02, 0.04])


async def test_retry_schedule_is_configurable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RESOLVER_RETRY_ATTEMPTS", "5")
    monkeypatch.setenv("RESOLVER_RETRY_BASE_MS", "7")
    settings = _settings()
    assert (settings.resolver_retry_attempts, settings.resolver_retry_base_ms) == (5, 7)
    tried, waits = await _failing_schedule(5, 7)
    assert (tried, waits) == (5, [0.007, 0.014, 0.028, 0.056])


async def test_one_attempt_means_no_wait() -> None:
    assert backoff_delays(1, 20) == ()
    assert await _failing_schedule(1, 20) == (1, [])


async def test_definite_answer_is_not_retried() -> None:
    tried = 0

    async def attempt() -> None:
        nonlocal tried
        tried += 1
        raise ValueError("a definite failure")

    with pytest.raises(ValueError):
        await with_retries(attempt, 3, 20)
    assert tried == 1


@pytest.mark.parametrize("attempts", [3, 5])
async def test_connection_refused_is_retried_then_unavailable(
    make_harness: Any, fresh_doubles: Any, attempts: int
) -> None:
    sock, port = refused_port()
    try:
        async with make_harness(resolver_retry_attempts=attempts) as h:
            args = {"column": "meter_id", "url": f"http://127.0.0.1:{port}/allowed"}
            reply = await h.resolve(claim("http_in_list", args, caller=person(fresh_doubles.issuer, "al")))
            assert (reply.outcome, reply.error_code) == ("error", "row_filter_unavailable"), reply
            assert f"after {attempts} attempts" in (reply.error_detail or "")
            assert retries_of(h) == attempts - 1
    finally:
        sock.close()


@pytest.mark.parametrize("attempts", [3, 5])
async def test_connection_dropped_is_retried_then_unavailable(
    make_harness: Any, fresh_doubles: Any, attempts: int
) -> None:
    listener = TcpDouble("close")
    try:
        async with make_harness(resolver_retry_attempts=attempts) as h:
            args = {"column": "meter_id", "url": listener.url + "/allowed"}
            reply = await h.resolve(claim("http_in_list", args, caller=person(fresh_doubles.issuer, "al")))
            assert (reply.outcome, reply.error_code) == ("error", "row_filter_unavailable"), reply
        # the client saw each hang-up only after the listener accepted, so all are counted
        assert listener.connections == attempts
    finally:
        listener.stop()


@pytest.mark.parametrize("attempts", [3, 4])
async def test_timeout_seconds_exceeded_is_retried_then_unavailable(
    make_harness: Any, fresh_doubles: Any, attempts: int
) -> None:
    listener = TcpDouble("hold")  # reads nothing, answers nothing: every attempt times out
    try:
        async with make_harness(resolver_retry_attempts=attempts) as h:
            args = {"column": "meter_id", "url": listener.url + "/allowed", "timeout_seconds": 0.2}
            reply = await h.resolve(claim("http_in_list", args, caller=person(fresh_doubles.issuer, "al")))
            assert (reply.outcome, reply.error_code) == ("error", "row_filter_unavailable"), reply
            assert retries_of(h) == attempts - 1

        # a connection the client gave up on may still wait in the accept queue: wait for it,
        # bounded only against a hang
        async def all_arrived() -> bool:
            return listener.connections >= attempts

        assert await eventually(all_arrived)
        assert listener.connections == attempts
    finally:
        listener.stop()
