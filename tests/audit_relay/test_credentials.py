"""docs/wire-contracts.md, "ds connector": the relay's own client-credentials bearer — fetched once,
refreshed before it expires, fetched again after a 401; a refused credential makes the relay unready
until ds accepts."""

from __future__ import annotations

import asyncio

from dataplane_testing import audit_relay as h


async def _readyz_failing(harness: h.Harness) -> list[str]:
    r = await asyncio.to_thread(harness.relay.readyz)
    assert r is not None
    return list(r.json().get("failing", [])) if r.status_code == 503 else []


async def test_token_refetched_after_401_and_refreshed_before_expiry(harness: h.Harness) -> None:
    warm = h.event(h.PROVIDER_A)
    await harness.publish([warm])
    await harness.wait_accepted([warm])
    before = harness.issuer.token_requests
    harness.issuer.token_lifetime = 4  # the next token: refreshed after 2.7 s, before its exp (3-4 s)
    try:
        harness.a.double.set_fault(endpoint="audit", status=401, count=1)
        first = h.event(h.PROVIDER_A)
        await harness.publish([first])
        await harness.wait_accepted([first])
        calls = harness.a.audit_calls([first["event_id"]])
        assert [c.status for c in calls] == [401, 200]
        assert calls[0].headers["authorization"] != calls[1].headers["authorization"]
        assert harness.issuer.token_requests == before + 1
    finally:
        harness.issuer.token_lifetime = 300  # whatever refreshes next lives long (later tests)
        harness.a.double.clear_faults()

    await asyncio.sleep(2.9)  # the short-lived token is now past its refresh point, not its exp
    second = h.event(h.PROVIDER_A)
    await harness.publish([second])
    await harness.wait_accepted([second])
    assert harness.issuer.token_requests == before + 2
    # refreshed ahead of expiry: ds (which checks exp) never refused it
    assert [c.status for c in harness.a.audit_calls([second["event_id"]])] == [200]


async def test_403_is_retried_and_makes_the_relay_unready_until_ds_accepts(harness: h.Harness) -> None:
    before = await asyncio.to_thread(harness.relay.metrics)
    harness.a.double.set_fault(endpoint="audit", status=403)
    try:
        ev = h.event(h.PROVIDER_A)
        await harness.publish([ev])
        await h.wait_for(lambda: len(harness.a.audit_calls([ev["event_id"]])) >= 2, 15, "403 retried")
        await h.wait_for(lambda: _has(harness, "ds_auth"), 10, "unready naming ds_auth")
    finally:
        harness.a.double.clear_faults()
    await harness.wait_accepted([ev])
    await harness.relay.wait_ready(10)
    statuses = [c.status for c in harness.a.audit_calls([ev["event_id"]])]
    assert set(statuses[:-1]) == {403} and statuses[-1] == 200
    # one retry counted per 403, one delivery once ds accepted
    delivered = h.sample(before, "audit_relay_delivered_total") + 1
    assert await h.wait_counter(harness.relay, "audit_relay_delivered_total", delivered) == delivered
    retried = h.sample(harness.relay.metrics(), "audit_relay_retried_total", cause="http_403")
    assert retried - h.sample(before, "audit_relay_retried_total", cause="http_403") == len(statuses) - 1


async def _has(harness: h.Harness, dependency: str) -> bool:
    return dependency in await _readyz_failing(harness)
