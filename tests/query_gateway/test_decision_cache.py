"""Hot path: the ds decision cache (docs/wire-contracts.md, `cache: {ttl_seconds}`).

Two layers: the cache module alone, on an injected clock; and the real gateway over HTTP against
the ds double, counting the authorize calls the double received. The gateways here are this
module's own, so what they cache never reaches another module's tests (the session gateway keeps
asking ds every time), and every test asks under its own transfer id."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from pydantic import ValidationError

from dataplane_contracts.ds import AuthorizeRequest, DecisionEnvelope
from dataplane_local.doubles.ds_connector import DsConnectorDouble
from dataplane_testing.gateway import (
    AGREEMENT,
    CONSUMER,
    PROVIDER,
    World,
    ds_policy,
    running_gateway,
    started_grant,
)
from dataplane_testing.metrics import scrape
from dataplane_testing.metrics import series as metric
from dataplane_testing.topics import TopicTail
from query_gateway.clients.decision_cache import DecisionKey, DsDecisionCache, decision_key
from query_gateway.metrics import Metrics

HITS = "query_gateway_ds_decision_cache_hits_total"
MISSES = "query_gateway_ds_decision_cache_misses_total"
REF = "a" * 64


# ============================================================================ the cache module
class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def request(**over: Any) -> AuthorizeRequest:
    values: dict[str, Any] = {
        "consumer_did": CONSUMER,
        "agreement_id": AGREEMENT,
        "transfer_id": "tp-1",
        "purpose": ["analytics", "billing"],
        "dataset_ids": ["readings", "stats"],
    }
    values.update(over)
    return AuthorizeRequest(**values)


def key(base: str = "http://ds.example", **over: Any) -> DecisionKey:
    return decision_key(base, request(**over))


def envelope(ttl: Any = 60, decision: str = "allow", *, cache_field: bool = True) -> DecisionEnvelope:
    body: dict[str, Any] = {
        "decision": decision,
        "datasets": [
            {
                "dataset_id": "readings",
                "decision": decision,
                "row_filter": {
                    "handler": "subject_key_match",
                    "args": {"column": "pod", "key_type": "pod"},
                    "keys": ["pod:pod-1"],
                    "subject_dids": ["did:web:alice.example"],
                },
            }
        ],
        "decision_ref": REF if decision == "allow" else None,
    }
    if cache_field:
        body["cache"] = {"ttl_seconds": ttl} if ttl != "null" else None
    return DecisionEnvelope.model_validate(body)


# the caches below count into this registry (the app's, in the gateway)
METRICS = Metrics()


def counted() -> tuple[float, float]:
    registry = METRICS.registry
    return (registry.get_sample_value(HITS) or 0.0, registry.get_sample_value(MISSES) or 0.0)


def test_ds_decision_cache_serves_before_the_ttl_and_never_at_or_after_it() -> None:
    clock = Clock()
    cache = DsDecisionCache(10, clock=clock, metrics=METRICS)
    answer = envelope(ttl=10)
    cache.put(key(), answer)
    clock.t += 9.999
    assert cache.get(key()) is answer  # the very object: no copy, no parse on a hit
    clock.t = 1010.0
    assert cache.get(key()) is None
    assert len(cache) == 0  # an expired entry is removed when seen
    clock.t = 1011.0
    assert cache.get(key()) is None


def test_ds_decision_cache_the_ttl_counts_from_when_ds_was_asked() -> None:
    clock = Clock(100.0)
    cache = DsDecisionCache(10, clock=clock, metrics=METRICS)
    cache.put(key(), envelope(ttl=10), asked_at=95.0)  # the answer took 5 s to arrive
    clock.t = 104.9
    assert cache.get(key()) is not None
    clock.t = 105.0
    assert cache.get(key()) is None


@pytest.mark.parametrize(
    ("base", "over"),
    [
        ("http://ds.example", {"agreement_id": "agr-2"}),
        ("http://ds.example", {"purpose": ["billing"]}),
        ("http://ds.example", {"purpose": ["billing", "analytics"]}),  # as sent: a list
        ("http://ds.example", {"purpose": []}),
        ("http://ds.example", {"consumer_did": "did:web:other-consumer.example"}),
        ("http://ds.example", {"transfer_id": "tp-2"}),
        ("http://ds.example", {"transfer_id": None}),
        ("http://ds.example/provider-b", {}),
        ("http://ds.example", {"dataset_ids": ["readings"]}),
        ("http://ds.example", {"dataset_ids": ["readings", "stats", "assets"]}),
    ],
)
def test_ds_decision_cache_another_question_never_shares_an_answer(base: str, over: dict[str, Any]) -> None:
    cache = DsDecisionCache(10, clock=Clock(), metrics=METRICS)
    cache.put(key(), envelope())
    assert cache.get(key(base, **over)) is None
    cache.put(key(base, **over), envelope(decision="deny"))
    mine, theirs = cache.get(key()), cache.get(key(base, **over))
    assert mine is not None and mine.allowed
    assert theirs is not None and not theirs.allowed


@pytest.mark.parametrize("datasets", [["stats", "readings"], ["stats", "readings", "stats"]])
def test_ds_decision_cache_the_same_dataset_set_in_another_order_shares(datasets: list[str]) -> None:
    cache = DsDecisionCache(10, clock=Clock(), metrics=METRICS)
    answer = envelope()
    cache.put(key(), answer)
    assert cache.get(key(dataset_ids=datasets)) is answer


@pytest.mark.parametrize(
    ("ttl", "cache_field"), [(0, True), (-5, True), (None, True), ("null", True), (None, False)]
)
def test_ds_decision_cache_an_answer_without_a_positive_ttl_is_not_kept(ttl: Any, cache_field: bool) -> None:
    cache = DsDecisionCache(10, clock=Clock(), metrics=METRICS)
    cache.put(key(), envelope(ttl=ttl, cache_field=cache_field))
    assert len(cache) == 0
    assert cache.get(key()) is None


def test_ds_decision_cache_a_newer_answer_without_a_ttl_retires_the_kept_one() -> None:
    cache = DsDecisionCache(10, clock=Clock(), metrics=METRICS)
    cache.put(key(), envelope(ttl=60))
    cache.put(key(), envelope(ttl=0))
    assert cache.get(key()) is None


def test_ds_decision_cache_a_deny_is_kept_like_an_allow() -> None:
    clock = Clock()
    cache = DsDecisionCache(10, clock=clock, metrics=METRICS)
    deny = envelope(ttl=5, decision="deny")
    cache.put(key(), deny)
    assert cache.get(key()) is deny
    clock.t += 5
    assert cache.get(key()) is None


def test_ds_decision_cache_maxsize_bounds_it_evicting_the_least_recently_used() -> None:
    cache = DsDecisionCache(2, clock=Clock(), metrics=METRICS)
    one, two, three = (key(transfer_id=f"tp-{i}") for i in (1, 2, 3))
    cache.put(one, envelope())
    cache.put(two, envelope())
    assert cache.get(one) is not None  # one is now the most recently used
    cache.put(three, envelope())
    assert len(cache) == 2
    assert cache.get(two) is None
    assert cache.get(one) is not None and cache.get(three) is not None
    with pytest.raises(ValueError, match="maxsize"):
        DsDecisionCache(0)


def test_ds_decision_cache_disabled_keeps_nothing_and_counts_nothing() -> None:
    cache = DsDecisionCache(10, enabled=False, clock=Clock(), metrics=METRICS)
    before = counted()
    cache.put(key(), envelope())
    assert cache.get(key()) is None
    assert len(cache) == 0
    assert counted() == before


def test_ds_decision_cache_counts_hits_and_misses_an_expired_entry_is_a_miss() -> None:
    clock = Clock()
    cache = DsDecisionCache(10, clock=clock, metrics=METRICS)
    hits, misses = counted()
    assert cache.get(key()) is None
    cache.put(key(), envelope(ttl=1))
    assert cache.get(key()) is not None
    assert cache.get(key()) is not None
    clock.t += 1
    assert cache.get(key()) is None
    assert counted() == (hits + 2, misses + 2)


def test_ds_decision_cache_the_kept_envelope_cannot_be_changed_by_its_readers() -> None:
    cache = DsDecisionCache(10, clock=Clock(), metrics=METRICS)
    cache.put(key(), envelope())
    kept = cache.get(key())
    assert kept is not None
    snapshot = kept.model_dump()
    with pytest.raises(ValidationError):
        kept.decision = "deny"  # type: ignore[misc]
    verdict = kept.verdict_for("readings")
    assert verdict is not None
    with pytest.raises(ValidationError):
        verdict.decision = "deny"  # type: ignore[misc]
    # what the dataspace path derives from a verdict is its own: changing it leaves the answer
    parsed = verdict.parse_row_filter()
    assert parsed is not None
    parsed.keys.append("pod:pod-9")
    parsed.subject_dids.append("did:web:mallory.example")
    parsed.args["column"] = "other"
    assert kept.model_dump() == snapshot
    assert cache.get(key()) is kept


# ============================================================================ through the gateway
KEY = ec.generate_private_key(ec.SECP256R1())
PUBLIC_PEM = (
    KEY.public_key()
    .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    .decode()
)
OTHER_AGREEMENT = "agr-2"
SKM = {"handler": "subject_key_match", "args": {"column": "pod", "key_type": "pod"}}
CONSENTS = {"meter": [{"subject_did": "did:web:alice.example", "keys": ["pod:pod-1"]}]}
# short enough that the "unreachable" case stays quick, long enough for a cold first request
# (EDR key set and service token) on a loaded machine
CONNECTOR_TIMEOUT = 2.0


def cached_policy(ttl: int | None, datasets: list[Any] | None = None) -> dict[str, Any]:
    """Two agreements of the one consumer over stats and readings; `ttl` None sends no cache."""
    policy = ds_policy(
        datasets or ["stats", {"dataset_id": "readings", "row_filter": dict(SKM), "consent": "meter"}],
        CONSENTS,
    )
    if ttl is not None:
        policy["agreements"][AGREEMENT]["cache"] = {"ttl_seconds": ttl}
    policy["agreements"][OTHER_AGREEMENT] = dict(policy["agreements"][AGREEMENT])
    return policy


@pytest.fixture(scope="module")
async def gateway(world: World, flows_url: str) -> AsyncIterator[httpx.AsyncClient]:
    """A gateway of its own with the cache on (the default), the EDR and the DPS pull path."""
    settings = world.settings(
        dps_enabled=True,
        dps_token_public_key=PUBLIC_PEM,
        dps_flows_database_url=flows_url,
        connector_timeout_seconds=CONNECTOR_TIMEOUT,
    )
    assert settings.ds_decision_cache_enabled
    async with running_gateway(settings) as client:
        yield client


@pytest.fixture
def tp() -> str:
    return f"tp-{uuid.uuid4().hex[:12]}"


async def edr_query(
    client: httpx.AsyncClient,
    world: World,
    transfer_id: str,
    sql: str = "SELECT id FROM stats ORDER BY id",
    *,
    agreement: str = AGREEMENT,
    purpose: str = "analytics",
) -> httpx.Response:
    headers = {
        "Authorization": f"Bearer {world.edr()}",  # a new token each time: the question is the same
        "Edc-Contract-Agreement-Id": agreement,
        "Edc-Transfer-Process-Id": transfer_id,
        "Edc-Purpose": purpose,
    }
    return await client.post("/query", json={"sql": sql}, headers=headers)


def ok(response: httpx.Response) -> list[dict[str, Any]]:
    assert response.status_code == 200, response.text
    items: list[dict[str, Any]] = response.json()["items"]
    return items


def refused(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.json()["error"] == code


async def counters(client: httpx.AsyncClient) -> tuple[float, float]:
    text = await scrape(client)
    return metric(text, HITS), metric(text, MISSES)


async def test_ds_decision_cache_an_identical_edr_query_within_the_ttl_is_not_asked_again(
    gateway: httpx.AsyncClient, world: World, ds: DsConnectorDouble, disclosures: TopicTail, tp: str
) -> None:
    ds.set_policy(cached_policy(60))
    hits, misses = await counters(gateway)
    sql = "SELECT id, pod FROM readings ORDER BY id"
    first = ok(await edr_query(gateway, world, tp, sql))
    second = ok(await edr_query(gateway, world, tp, sql))
    assert first == second == [{"id": 1, "pod": "pod-1"}]
    [call] = ds.calls("authorize")
    assert await counters(gateway) == (hits + 1, misses + 1)
    # each query still publishes its own disclosure, with the decision_ref of the one answer
    records = await disclosures.read_where(2, lambda r: json.loads(r.value)["transfer_id"] == tp)
    events = [json.loads(r.value) for r in records]
    expected_ref = ds.decide("", call.body)["decision_ref"]
    assert [e["decision_ref"] for e in events] == [expected_ref, expected_ref]
    assert [e["authorized_subject_ids"] for e in events] == [["did:web:alice.example"]] * 2
    assert len({e["event_id"] for e in events}) == 2


async def test_ds_decision_cache_another_purpose_agreement_transfer_or_dataset_set_is_asked(
    gateway: httpx.AsyncClient, world: World, ds: DsConnectorDouble, tp: str
) -> None:
    ds.set_policy(cached_policy(60))
    ok(await edr_query(gateway, world, tp))
    ok(await edr_query(gateway, world, tp, purpose="billing"))
    ok(await edr_query(gateway, world, tp, agreement=OTHER_AGREEMENT))
    ok(await edr_query(gateway, world, f"{tp}-b"))
    join = "SELECT s.id FROM stats s JOIN readings r ON r.id = s.id"
    assert ok(await edr_query(gateway, world, tp, join)) == [{"id": 1}]
    bodies = [c.body for c in ds.calls("authorize")]
    assert [(b["purpose"], b["agreement_id"], b["transfer_id"]) for b in bodies] == [
        (["analytics"], AGREEMENT, tp),
        (["billing"], AGREEMENT, tp),
        (["analytics"], OTHER_AGREEMENT, tp),
        (["analytics"], AGREEMENT, f"{tp}-b"),
        (["analytics"], AGREEMENT, tp),
    ]
    assert sorted(bodies[-1]["dataset_ids"]) == ["readings", "stats"]
    # every one of those questions is now answered from the cache, the join in either order too
    ok(await edr_query(gateway, world, tp))
    ok(await edr_query(gateway, world, tp, purpose="billing"))
    ok(await edr_query(gateway, world, tp, agreement=OTHER_AGREEMENT))
    reversed_join = "SELECT r.id FROM readings r JOIN stats s ON s.id = r.id"
    assert ok(await edr_query(gateway, world, tp, reversed_join)) == [{"id": 1}]
    assert len(ds.calls("authorize")) == 5


@pytest.mark.parametrize("ttl", [0, None], ids=["ttl-0", "no-cache-field"])
async def test_ds_decision_cache_an_answer_without_a_positive_ttl_is_asked_every_time(
    gateway: httpx.AsyncClient, world: World, ds: DsConnectorDouble, tp: str, ttl: int | None
) -> None:
    ds.set_policy(cached_policy(ttl))
    hits, misses = await counters(gateway)
    for _ in range(3):
        ok(await edr_query(gateway, world, tp))
    assert len(ds.calls("authorize")) == 3
    assert all(c.status == 200 for c in ds.calls("authorize"))
    assert await counters(gateway) == (hits, misses + 3)


async def test_ds_decision_cache_disabled_asks_ds_every_time_and_counts_nothing(
    world: World, ds: DsConnectorDouble, tp: str
) -> None:
    ds.set_policy(cached_policy(60))
    async with running_gateway(world.settings(ds_decision_cache_enabled=False)) as client:
        before = await counters(client)
        for _ in range(3):
            ok(await edr_query(client, world, tp))
        assert len(ds.calls("authorize")) == 3
        assert await counters(client) == before


async def test_ds_decision_cache_a_cached_deny_refuses_again_without_a_call(
    gateway: httpx.AsyncClient, world: World, ds: DsConnectorDouble, tp: str
) -> None:
    ds.set_policy(cached_policy(60))  # ds's policy allows: only its one cached deny refuses
    deny = {
        "decision": "deny",
        "reason": "consent_missing",
        "datasets": [{"dataset_id": "stats", "decision": "deny", "reason": "consent_missing"}],
        "cache": {"ttl_seconds": 60},
    }
    ds.set_fault(endpoint="authorize", status=200, body=deny, count=1)
    refused(await edr_query(gateway, world, tp), 403, "ds_refused")
    refused(await edr_query(gateway, world, tp), 403, "ds_refused")
    assert len(ds.calls("authorize")) == 1
    ok(await edr_query(gateway, world, f"{tp}-b"))  # another question: ds is asked, and allows
    assert len(ds.calls("authorize")) == 2


@pytest.mark.parametrize(
    "fault",
    [
        {"status": 500},
        {"status": 200, "text": "not json"},
        {"status": 200, "body": {"verdict": "allow"}},  # no `decision`: unreadable
        {"status": None, "delay_seconds": CONNECTOR_TIMEOUT + 1.5},  # no answer in time
    ],
    ids=["status-500", "not-json", "unreadable-envelope", "unreachable"],
)
async def test_ds_decision_cache_a_failed_question_is_not_cached(
    gateway: httpx.AsyncClient, world: World, ds: DsConnectorDouble, tp: str, fault: dict[str, Any]
) -> None:
    ds.set_policy(cached_policy(60))
    ds.set_fault(endpoint="authorize", count=1, **fault)
    refused(await edr_query(gateway, world, tp), 502, "ds_unavailable")
    if fault.get("delay_seconds"):
        # the slow answer lands in the double's call log late, if at all; let it, then forget it
        await asyncio.sleep(fault["delay_seconds"])
    ds.clear_calls()
    ok(await edr_query(gateway, world, tp))  # asked again, and answered properly
    ok(await edr_query(gateway, world, tp))  # that answer is the one kept
    [call] = ds.calls("authorize")
    assert call.status == 200


async def test_ds_decision_cache_expires_over_real_time(
    gateway: httpx.AsyncClient, world: World, ds: DsConnectorDouble, tp: str
) -> None:
    ds.set_policy(cached_policy(1))
    ok(await edr_query(gateway, world, tp))
    assert len(ds.calls("authorize")) == 1
    await asyncio.sleep(1.5)
    ok(await edr_query(gateway, world, tp))
    assert len(ds.calls("authorize")) == 2


# ---------------------------------------------------------------------------- the DPS pull path
def pull_token(jti: str) -> str:
    claims = {"jti": jti, "iss": PROVIDER, "sub": PROVIDER, "aud": CONSUMER, "iat": int(time.time())}
    return jwt.encode(claims, KEY, algorithm="ES256")


async def set_state(flows_url: str, jti: str, state: str | None) -> None:
    conn = await asyncpg.connect(flows_url)
    if state is None:
        await conn.execute("DELETE FROM dps_pull_grants WHERE token_id = $1", jti)
    else:
        await conn.execute("UPDATE dps_pull_grants SET state = $2 WHERE token_id = $1", jti, state)
    await conn.close()


async def pull(client: httpx.AsyncClient, jti: str, tp: str) -> httpx.Response:
    return await client.post(
        "/dps/public/query",
        json={"sql": "SELECT id FROM stats ORDER BY id"},
        headers={"Authorization": f"Bearer {pull_token(jti)}", "Edc-Transfer-Process-Id": tp},
    )


async def test_ds_decision_cache_the_pull_grant_is_still_read_on_every_request(
    gateway: httpx.AsyncClient, flows_url: str, ds: DsConnectorDouble, tp: str
) -> None:
    ds.set_policy(cached_policy(60))
    jti = await started_grant(flows_url)
    assert ok(await pull(gateway, jti, tp)) == [{"id": 1}, {"id": 2}]
    assert ok(await pull(gateway, jti, tp)) == [{"id": 1}, {"id": 2}]
    assert len(ds.calls("authorize")) == 1  # the decision is cached ...
    # ... and signaling's suspension, termination or retirement still refuses the very next pull
    await set_state(flows_url, jti, "SUSPENDED")
    refused(await pull(gateway, jti, tp), 403, "flow_not_started")
    await set_state(flows_url, jti, "TERMINATED")
    refused(await pull(gateway, jti, tp), 403, "flow_not_started")
    await set_state(flows_url, jti, None)
    refused(await pull(gateway, jti, tp), 401, "pull_token")
    # another live flow asking the same question is served with the cached decision
    assert ok(await pull(gateway, await started_grant(flows_url), tp)) == [{"id": 1}, {"id": 2}]
    assert len(ds.calls("authorize")) == 1
