"""The dataspace story across processes — `dataplane-local demo` against the real local stack (two
gateway replicas): the table and an unfiltered admin, a DPS start on signaling, the narrowed pull,
ds's verdict, the DID-only disclosure through Kafka and the audit relay, a consent withdrawn at ds
live, suspend seen by every gateway replica, the person path on the normal API."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from dataplane_local.demo import (
    DEMO_AGREEMENT,
    DEMO_CONSUMER,
    STEPS,
    Wire,
    client_token,
    consenting,
    control_plane_token,
    pull,
    rows_pods,
    run_story,
    signal,
    start_pull_flow,
)
from dataplane_testing.e2e import ALICE_PODS, ALL_PODS, System, local_cli

pytestmark = pytest.mark.e2e


async def test_demo_story_holds_end_to_end(system: System) -> None:
    lines: list[str] = []
    result = await run_story(system.info, out=lines.append)
    failed = [f"{name}: {detail}" for name, ok, detail in result.steps if not ok]
    assert result.ok, "\n".join([*failed, "--- transcript ---", *lines[-40:]])
    # the story issue 14 asks for: every step ran, in order
    assert [name for name, _, _ in result.steps] == STEPS
    # nothing printed can be replayed: every token in the transcript is shortened
    assert result.flow is not None and result.flow.token not in "\n".join(lines)
    # the demo left ds as it found it: the withdrawn consent is granted again
    pods, _ = consenting()
    decision = await _ds_decision(system)
    keys = decision["datasets"][0]["row_filter"]["keys"]
    assert {k.split(":", 1)[1] for k in keys} == pods


async def test_dps07_suspend_refuses_the_old_token_on_both_gateway_replicas(system: System) -> None:
    assert len(system.gateways) == 2
    wire = Wire(system.http)
    cp = await control_plane_token(wire, system.info)
    flow = await start_pull_flow(wire, system.info, cp)
    pods, _ = consenting()
    for gateway in system.gateways:  # the token is good on every replica while the flow runs
        ok = await pull(wire, f"{gateway}/dps/public", flow.token)
        assert ok.status_code == 200, ok.text
        assert rows_pods(ok) == pods
    suspended = await signal(wire, system.info, cp, flow.flow_id, "suspend")
    assert suspended.status_code == 200, suspended.text
    for gateway in system.gateways:
        refused = await pull(wire, f"{gateway}/dps/public", flow.token)
        body: dict[str, Any] = refused.json()
        assert refused.status_code == 401, (gateway, refused.text)
        assert body["error"] == "pull_token" and "items" not in body


async def test_demo_command_tells_each_step_and_exits_zero(system: System) -> None:
    """`dataplane-local demo` itself, read as a user reads it: each step's output is checked."""
    rc, text = await local_cli(system.root, "demo")
    assert rc == 0, text
    assert "the story holds end to end" in text
    summary = text[text.index("Summary:") :]
    for name in STEPS:
        assert f"[ok] {name}" in summary, (name, summary)
    story = _sections(text[: text.index("Summary:")])
    bodies = _bodies(text)
    # nothing truncated mid-JSON: every printed body is one whole JSON document
    assert len(bodies) > 20
    # 1. the table holds all four supply points, and the platform-admin's answer has them all
    assert all(pod in story[1] for pod in ALL_PODS)
    admin = [b for b in bodies if isinstance(b, dict) and b.get("total") == len(ALL_PODS)]
    assert admin and {i["pod"] for i in admin[0]["items"]} == ALL_PODS
    # 2. the start message is spec-shaped: RC2 and RC3 fields, claims, dataspaceContext
    start = next(b for b in bodies if isinstance(b, dict) and "processId" in b)
    for fieldname in ("messageId", "participantId", "counterPartyId", "agreementId", "datasetId"):
        assert start[fieldname], fieldname
    assert start["transferType"] == start["profile"] == "https://w3id.org/dspace-sig/profile/http-pull"
    assert start["claims"] and start["dataspaceContext"] and "dataAddress" not in start
    assert "callbackAddress" not in start
    # 3. the consumer's narrowed answer: the consenting pods only
    pods, dids = consenting()
    pulled = _pods_in(_bodies(story[3]))
    assert pulled == [pods]
    # 4. ds's verdict: subject_key_match, keys masked (no whole key printed anywhere in it)
    verdict = next(b for b in _bodies(story[4]) if isinstance(b, dict) and "datasets" in b)
    row_filter = verdict["datasets"][0]["row_filter"]
    assert row_filter["handler"] == "subject_key_match"
    assert len(row_filter["keys"]) == len(pods) and all("…" in k for k in row_filter["keys"])
    assert "pod:IT001E" not in story[4]
    # 5. the DID-only disclosure, with user_id and subject_id null and why
    disclosure = next(b for b in _bodies(story[5]) if isinstance(b, list))[0]
    assert disclosure["user_id"] is None and disclosure["subject_id"] is None
    assert set(disclosure["authorized_subject_ids"]) == dids
    assert "user_id and subject_id are always null" in story[5]
    # 6. a consent withdrawn at ds: ds's next verdict and the next answer shrink
    withdrawn = sorted(dids)[-1]
    left, _ = consenting(withdrawn=[withdrawn])
    assert f"{withdrawn} withdraws consent at ds" in story[6] and "cache.ttl_seconds" in story[6]
    assert _pods_in(_bodies(story[6])) == [left]
    # 7. the suspend refuses the token on both gateway replicas
    for gateway in system.gateways:
        assert f"→ POST {gateway}/dps/public/query" in story[7]
    refusals = [b for b in _bodies(story[7]) if isinstance(b, dict) and b.get("error") == "pull_token"]
    assert len(refusals) == len(system.gateways) == 2
    # 8. the person path: alice reads her meters, bob (no meter) reads nothing
    assert _pods_in(_bodies(story[8])) == [ALICE_PODS, set()]
    assert not re.search(r"eyJ[\w-]{20,}\.[\w-]+\.", text)  # no whole token printed


def _sections(text: str) -> dict[int, str]:
    """The transcript cut at its numbered step headings (`\n3. ...`)."""
    parts = re.split(r"\n(?=\d\. )", text)
    return {int(p.split(".", 1)[0]): p for p in parts if p[:1].isdigit()}


def _bodies(text: str) -> list[Any]:
    """Every JSON body the demo printed (a block of lines indented six spaces), parsed: a body
    cut off mid-document would raise here."""
    blocks: list[list[str]] = []
    previous = False
    for line in text.splitlines():
        inside = line.startswith("      ")
        if inside and not previous:
            blocks.append([])
        if inside:
            blocks[-1].append(line[6:])
        previous = inside
    return [json.loads("\n".join(block)) for block in blocks]


def _pods_in(bodies: list[Any]) -> list[set[str]]:
    return [{i["pod"] for i in b["items"]} for b in bodies if isinstance(b, dict) and "items" in b]


async def _ds_decision(system: System) -> dict[str, Any]:
    """ds's decision for the demo agreement now, asked as the gateway asks (a service token)."""
    env = system.info.env
    token = await client_token(
        Wire(system.http), system.info, env["CELINE_OIDC_CLIENT_ID"], env["CELINE_OIDC_CLIENT_SECRET"]
    )
    body = {
        "consumer_did": DEMO_CONSUMER,
        "agreement_id": DEMO_AGREEMENT,
        "transfer_id": None,
        "purpose": [],
        "dataset_ids": ["meter_readings"],
    }
    r = await system.http.post(
        f"{system.info.ds_url}/internal/dataplane/authorize",
        json=body,
        headers={"Authorization": f"Bearer {token}"},
    )
    assert r.status_code == 200, r.text
    decision: dict[str, Any] = r.json()
    return decision
