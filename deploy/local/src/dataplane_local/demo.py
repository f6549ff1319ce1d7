"""`dataplane-local demo`: the dataspace story told against a running local stack, one real HTTP
request at a time (method, URL, status, the whole body as JSON; every token shortened, ds's keys
masked). The story, in `run_story`'s steps:

1. the table holds every supply point, and an unfiltered platform-admin sees them all;
2. a control plane starts a DPS pull flow on signaling with a spec-shaped start message (RC2's
   `transferType` and RC3's `profile`, `processId`, `claims`, `dataspaceContext`);
3. the consumer pulls and gets only the consenting supply points' rows;
4. ds's verdict for that pull: a `subject_key_match` row filter over the consenting keys;
5. the disclosure arriving at ds names subject DIDs only (`user_id`/`subject_id` null);
6. a subject withdraws consent at ds, live; once the lifetime ds gave its earlier answer has
   passed, the next pull shrinks (the gateway reuses a ds decision for at most `cache.ttl_seconds`);
7. the control plane suspends the flow and every gateway replica refuses the token (401);
8. the person path on the normal API: each REC member reads the meters the registry lists as
   theirs, as the demo catalogue promises.

The demo leaves the ds double as it found it (the withdrawn consent is granted again at the end).
The step functions are also what `tests/e2e` drive, so the story printed here is the one asserted."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import yaml

from dataplane_local import provision
from dataplane_local.demo_show import _JWT, mask_verdict_keys, one_line, redact, redact_json, show_body

DEPLOY_LOCAL = Path(__file__).resolve().parents[2]
DEMO_AGREEMENT = "agr-demo"
DEMO_CONSUMER = "did:web:consumer.example"
DEMO_PROVIDER = "did:web:provider.example"
DEMO_DATASET = "meter_readings"
DEMO_CONSENT = "meter-readings-consent"
DEMO_DATASPACE = "urn:dataspace:dataplane-local-demo"
HTTP_PULL_PROFILE = "https://w3id.org/dspace-sig/profile/http-pull"
DEMO_SQL = "SELECT pod, count(*) AS readings FROM meter_readings GROUP BY pod ORDER BY pod"
TOKEN_PATH = "/protocol/openid-connect/token"
PLATFORM_ADMIN = "platform-admin"
_TRIM = 600


class DemoFailure(RuntimeError):
    """A step's answer was not the expected one."""


@dataclass(frozen=True)
class StackInfo:
    """What `dataplane-local up` wrote into `stack.json`."""

    env: dict[str, str]
    tools: dict[str, str]
    urls: dict[str, str]
    replicas: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def load(cls, root: Path) -> StackInfo:
        path = root / "stack.json"
        if not path.exists():
            raise DemoFailure(f"no running stack: {path} is missing (run `dataplane-local up` first)")
        data = json.loads(path.read_text())
        return cls(data["env"], data["tools"], data["urls"], data.get("replicas") or {})

    def service_urls(self, name: str) -> list[str]:
        key = f"DATAPLANE_{name.upper().replace('-', '_')}_URL"
        return self.replicas.get(name) or ([self.tools[key]] if key in self.tools else [])

    @property
    def gateway_urls(self) -> list[str]:
        return self.service_urls("query-gateway")

    @property
    def signaling_url(self) -> str:
        return self.tools["DATAPLANE_SIGNALING_URL"]

    @property
    def ds_url(self) -> str:
        return self.tools["DATAPLANE_DS_CONNECTOR_URL"]

    @property
    def oidc_url(self) -> str:
        return self.tools["DATAPLANE_OIDC_URL"]


class Wire:
    """An httpx client that prints each request and answer (tokens redacted) when asked to."""

    def __init__(self, http: httpx.AsyncClient, out: Callable[[str], None] | None = None) -> None:
        self.http = http
        self.out = out

    def say(self, line: str) -> None:
        if self.out is not None:
            self.out(line)

    async def call(
        self,
        method: str,
        url: str,
        *,
        json_body: Any = None,
        form: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        show: bool = True,
    ) -> httpx.Response:
        response = await self.http.request(method, url, json=json_body, data=form, headers=headers)
        if self.out is not None and show:
            shown = {k: redact(v) for k, v in (headers or {}).items() if k.lower() != "content-type"}
            self.out(f"  → {method} {url}" + (f"  {shown}" if shown else ""))
            sent = json_body if json_body is not None else redact_json(form) if form else None
            if sent is not None:
                self.out(show_body(sent))
            self.out(f"  ← {response.status_code}")
            answer = _json_or_text(response)
            if answer is not None:
                self.out(show_body(answer))
        return response


def _json_or_text(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text[:_TRIM] if response.text else None


def _policy(policy_path: Path | None) -> dict[str, Any]:
    policy: dict[str, Any] = yaml.safe_load((policy_path or DEPLOY_LOCAL / "ds-policy.yaml").read_text())
    return policy


def consenting(
    policy_path: Path | None = None, agreement: str = DEMO_AGREEMENT, withdrawn: Iterable[str] = ()
) -> tuple[set[str], set[str]]:
    """(pods, subject DIDs) of the live consents behind the agreement's dataset, from the policy
    file the ds double serves (less the subjects in `withdrawn`): the rows the consumer must get,
    and the DIDs ds must be told."""
    policy = _policy(policy_path)
    gone = set(withdrawn)
    pods: set[str] = set()
    dids: set[str] = set()
    for entry in policy["agreements"][agreement]["datasets"]:
        for grant in policy["consents"].get(entry.get("consent"), []):
            if not grant.get("withdrawn") and grant["subject_did"] not in gone:
                dids.add(grant["subject_did"])
                pods.update(k.split(":", 1)[1] for k in grant.get("keys", []))
    return pods, dids


def member_pods(registry_path: Path | None = None) -> dict[str, set[str]]:
    """Each REC member's metered supply points, from the registry file the double serves: what
    the catalogue's person layer (`rec_registry` over `pod`) promises each member on the normal API."""
    config = yaml.safe_load((registry_path or DEPLOY_LOCAL / "rec-registry.yaml").read_text())
    return {
        name: {str(a["sensor_id"]) for a in member.get("assets") or [] if a.get("sensor_id")}
        for name, member in config["members"].items()
    }


# ----------------------------------------------------------------------------- the steps
async def client_token(wire: Wire, info: StackInfo, client_id: str, secret: str) -> str:
    r = await wire.call(
        "POST",
        info.oidc_url + TOKEN_PATH,
        form={"grant_type": "client_credentials", "client_id": client_id, "client_secret": secret},
    )
    if r.status_code != 200 or "access_token" not in r.json():
        raise DemoFailure(f"the OIDC issuer gave no token for {client_id} ({r.status_code})")
    return str(r.json()["access_token"])


async def control_plane_token(wire: Wire, info: StackInfo) -> str:
    return await client_token(
        wire,
        info,
        info.tools["DATAPLANE_CONTROL_PLANE_CLIENT_ID"],
        info.tools["DATAPLANE_CONTROL_PLANE_CLIENT_SECRET"],
    )


async def user_token(wire: Wire, info: StackInfo, claims: dict[str, Any]) -> str:
    """A person's token from the OIDC double's development-only mint (Keycloak-shaped claims)."""
    r = await wire.call("POST", f"{info.oidc_url}/_mint", json_body={"claims": claims})
    if r.status_code != 200 or "token" not in r.json():
        raise DemoFailure(f"the OIDC issuer minted no user token ({r.status_code})")
    return str(r.json()["token"])


@dataclass(frozen=True)
class PullAddress:
    flow_id: str
    endpoint: str
    token: str


def start_message(
    flow_id: str,
    *,
    agreement: str = DEMO_AGREEMENT,
    consumer: str = DEMO_CONSUMER,
    dataset: str = DEMO_DATASET,
    provider: str = DEMO_PROVIDER,
    transfer_type: str = "HttpData-PULL",
) -> dict[str, Any]:
    """A DataFlowStartMessage as the DPS schema has it: `processId` (the flow id in RC2 and RC3),
    the deciding facts, `dataspaceContext`, and `claims` — the counter-party's claims as the
    control plane verified them. A profile URI is sent under both spellings, RC2's `transferType`
    and RC3's `profile`, as a control plane between the two does; no `dataAddress` (a consumer
    pull) and no `callbackAddress` (RC3 dropped it)."""
    message: dict[str, Any] = {
        "messageId": str(uuid.uuid4()),
        "processId": flow_id,
        "participantId": provider,
        "counterPartyId": consumer,
        "dataspaceContext": DEMO_DATASPACE,
        "agreementId": agreement,
        "datasetId": dataset,
        "transferType": transfer_type,
        "claims": {
            "participantId": consumer,
            "membership": {"status": "active", "dataspace": DEMO_DATASPACE},
        },
        "labels": [],
        "metadata": {},
    }
    if transfer_type.startswith("https://"):
        message["profile"] = transfer_type
    return message


async def start_pull_flow(
    wire: Wire,
    info: StackInfo,
    cp_token: str,
    *,
    flow_id: str | None = None,
    agreement: str = DEMO_AGREEMENT,
    consumer: str = DEMO_CONSUMER,
    dataset: str = DEMO_DATASET,
    provider: str = DEMO_PROVIDER,
    traceparent: str | None = None,
    transfer_type: str = "HttpData-PULL",
) -> PullAddress:
    flow_id = flow_id or f"flow-{uuid.uuid4().hex[:12]}"
    message = start_message(
        flow_id,
        agreement=agreement,
        consumer=consumer,
        dataset=dataset,
        provider=provider,
        transfer_type=transfer_type,
    )
    r = await wire.call(
        "POST",
        f"{info.signaling_url}/dps/v1/dataflows/start",
        json_body=message,
        headers={
            "Authorization": f"Bearer {cp_token}",
            **({"traceparent": traceparent} if traceparent else {}),
        },
    )
    if r.status_code != 200:
        raise DemoFailure(f"start answered {r.status_code}, expected 200: {redact(r.text[:300])}")
    body = r.json()
    address = body.get("dataAddress") or {}
    props = {
        p.get("name", "").rsplit("/", 1)[-1]: p.get("value") for p in address.get("endpointProperties", [])
    }
    endpoint, token = address.get("endpoint") or props.get("endpoint"), props.get("authorization")
    if body.get("state") != "STARTED" or not endpoint or not token:
        raise DemoFailure("start did not answer a STARTED flow with an endpoint and a pull token")
    return PullAddress(flow_id, str(endpoint), str(token))


async def pull(
    wire: Wire,
    endpoint: str,
    token: str,
    sql: str = DEMO_SQL,
    *,
    transfer_id: str | None = None,
    traceparent: str | None = None,
    show: bool = True,
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"}
    if transfer_id:
        headers["Edc-Transfer-Process-Id"] = transfer_id
    if traceparent:
        headers["traceparent"] = traceparent
    return await wire.call("POST", f"{endpoint}/query", json_body={"sql": sql}, headers=headers, show=show)


async def signal(wire: Wire, info: StackInfo, cp_token: str, flow_id: str, action: str) -> httpx.Response:
    return await wire.call(
        "POST",
        f"{info.signaling_url}/dps/v1/dataflows/{flow_id}/{action}",
        json_body={"messageId": str(uuid.uuid4()), "reason": "demo"},
        headers={"Authorization": f"Bearer {cp_token}"},
    )


async def ds_calls(wire: Wire, info: StackInfo, endpoint: str) -> list[dict[str, Any]]:
    r = await wire.http.get(f"{info.ds_url}/_calls", params={"endpoint": endpoint})
    r.raise_for_status()
    calls: list[dict[str, Any]] = r.json()
    return calls


async def audit_calls(
    wire: Wire, info: StackInfo, transfer_ids: Iterable[str], timeout: float = 30.0, show: bool = True
) -> list[dict[str, Any]]:
    """The ds double's recorded audit posts for these transfer ids, waited for (at least once
    delivery is asynchronous: gateway → Kafka → audit-relay → ds)."""
    wanted = set(transfer_ids)
    deadline = time.monotonic() + timeout
    while True:
        calls = [
            c
            for c in await ds_calls(wire, info, "audit")
            if isinstance(c.get("body"), dict) and c["body"].get("transfer_id") in wanted
        ]
        seen = {c["body"]["transfer_id"] for c in calls if 200 <= c["status"] < 300}
        if seen >= wanted or time.monotonic() > deadline:
            if show:
                wire.say(f"  → GET {info.ds_url}/_calls?endpoint=audit   (what ds received)")
                wire.say(show_body([c["body"] for c in calls]))
            return calls
        await asyncio.sleep(0.2)


async def ds_verdicts(wire: Wire, info: StackInfo, agreement: str, since: float) -> list[dict[str, Any]]:
    """ds's recorded authorize calls for `agreement` since `since` (epoch seconds): the question
    each gateway asked and the decision ds answered."""
    return [
        c
        for c in await ds_calls(wire, info, "authorize")
        if c["at"] >= since and isinstance(c.get("body"), dict) and c["body"].get("agreement_id") == agreement
    ]


async def set_consent(wire: Wire, info: StackInfo, subject_did: str, *, withdrawn: bool) -> None:
    body = {"action": "consent", "consent": DEMO_CONSENT, "subject_did": subject_did, "withdrawn": withdrawn}
    r = await wire.call("POST", f"{info.ds_url}/_control", json_body=body)
    if r.status_code != 200:
        raise DemoFailure(f"the ds double refused the consent change ({r.status_code})")


async def wait_out_ds_cache(wire: Wire, info: StackInfo, agreement: str) -> float:
    """Wait until every answer ds gave for `agreement` is past the lifetime it carried
    (`cache.ttl_seconds`): no gateway replica may then reuse one, so the next pull asks ds again.
    Returns the seconds waited."""
    now = time.time()
    until = now
    for call in await ds_verdicts(wire, info, agreement, since=0.0):
        ttl = ((call.get("answer") or {}).get("cache") or {}).get("ttl_seconds")
        if isinstance(ttl, int) and ttl > 0:
            until = max(until, call["at"] + ttl + 0.2)
    waited = max(until - now, 0.0)
    if waited:
        await asyncio.sleep(waited)
    return waited


def rows_pods(response: httpx.Response) -> set[str]:
    return {str(item["pod"]) for item in response.json().get("items", [])}


def check_disclosure(calls: list[dict[str, Any]], dids: set[str], forbidden: Iterable[str]) -> str | None:
    """None when ds got a disclosure naming exactly these DIDs and nothing personal; else why not."""
    accepted = [c for c in calls if 200 <= c["status"] < 300]
    if not accepted:
        return "ds received no disclosure"
    for call in accepted:
        body = call["body"]
        subjects = body.get("authorized_subject_ids")
        if not isinstance(subjects, list) or set(subjects) != dids:
            return f"authorized_subject_ids is {subjects!r}, expected {sorted(dids)}"
        if not all(isinstance(s, str) and s.startswith("did:") for s in subjects):
            return "authorized_subject_ids holds something that is not a DID"
        if body.get("user_id") is not None or body.get("subject_id") is not None:
            return "user_id or subject_id is not null"
        text = json.dumps({k: v for k, v in body.items() if k != "authorized_subject_ids"})
        leaked = [f for f in forbidden if f in text]
        if leaked or _JWT.search(text):
            return "the disclosure carries a key, principal or token"
    return None


def check_verdict(answer: Any, pods: set[str], dids: set[str]) -> str | None:
    """None when ds's answer allows the dataset with a subject_key_match filter over exactly
    these consenting keys and DIDs; else why not."""
    if not isinstance(answer, dict) or answer.get("decision") != "allow":
        return f"ds did not allow: {one_line(mask_verdict_keys(answer))}"
    verdicts = [v for v in answer.get("datasets") or [] if v.get("dataset_id") == DEMO_DATASET]
    if len(verdicts) != 1:
        return "ds's answer does not hold exactly one verdict for the dataset"
    row_filter = verdicts[0].get("row_filter") or {}
    if row_filter.get("handler") != "subject_key_match":
        return f"the row filter is {row_filter.get('handler')!r}, not subject_key_match"
    keys = {str(k).split(":", 1)[-1] for k in row_filter.get("keys") or []}
    if keys != pods or set(row_filter.get("subject_dids") or []) != dids:
        return "the filter's keys or subject DIDs are not the live consents"
    return None


# ----------------------------------------------------------------------------- the story
@dataclass
class StoryResult:
    steps: list[tuple[str, bool, str]] = field(default_factory=list)
    flow: PullAddress | None = None

    @property
    def ok(self) -> bool:
        return bool(self.steps) and all(ok for _, ok, _ in self.steps)

    def add(self, name: str, ok: bool, detail: str) -> bool:
        self.steps.append((name, ok, detail))
        return ok


# the steps' names, in order (the summary and the tests read them)
STEPS = [
    "the table holds every supply point",
    "an unfiltered admin sees every supply point",
    "start pull flow",
    "pull serves consenting rows only",
    "ds's verdict is a subject_key_match filter",
    "ds got a DID-only disclosure",
    "consent withdrawn at ds: the next answer shrinks",
    "suspend",
    "pull after suspend refused on every gateway replica",
    "the person path serves each member's own meters",
]


async def _table(wire: Wire, info: StackInfo, result: StoryResult) -> set[str]:
    wire.say("\n1. The provider's table holds every supply point (read directly, as the database owner)")
    url = provision.with_database(info.tools["DATAPLANE_ADMIN_DATABASE_URL"], provision.DATASETS_DB)
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(DEMO_SQL)
    finally:
        await conn.close()
    wire.say(f"  SQL> {DEMO_SQL}")
    for row in rows:
        wire.say(f"   | {row['pod']} | {row['readings']} readings |")
    every = {str(r["pod"]) for r in rows}
    result.add(STEPS[0], len(every) >= 2, f"{len(every)} supply points: {sorted(every)}")
    return every


async def _admin(wire: Wire, info: StackInfo, result: StoryResult, every: set[str]) -> None:
    wire.say("\n   On the normal API, a platform-admin (realm role) is not row-filtered: it sees them all")
    token = await user_token(
        wire,
        info,
        {"sub": "u-admin", "preferred_username": "admin", "realm_access": {"roles": [PLATFORM_ADMIN]}},
    )
    r = await wire.call(
        "POST",
        f"{info.gateway_urls[0]}/query",
        json_body={"sql": DEMO_SQL},
        headers={"Authorization": f"Bearer {token}"},
    )
    got = rows_pods(r) if r.status_code == 200 else set()
    result.add(STEPS[1], r.status_code == 200 and got == every, f"{r.status_code}, pods {sorted(got)}")


async def _withdraw(wire: Wire, info: StackInfo, result: StoryResult, flow: PullAddress, who: str) -> None:
    pods, _ = consenting()
    left_pods, left_dids = consenting(withdrawn=[who])
    wire.say(f"\n6. {who} withdraws consent at ds, live; the consumer pulls again")
    await set_consent(wire, info, who, withdrawn=True)
    waited = await wait_out_ds_cache(wire, info, DEMO_AGREEMENT)
    wire.say(
        f"   (each gateway replica may reuse ds's earlier answer for the cache.ttl_seconds ds put on it;"
        f" waited {waited:.1f} s for that lifetime to pass — a withdrawal takes effect at the latest"
        " then, and immediately when ds answers without a ttl)"
    )
    asked = time.time()
    r = await pull(wire, flow.endpoint, flow.token, transfer_id=flow.flow_id)
    got = rows_pods(r) if r.status_code == 200 else set()
    verdicts = await ds_verdicts(wire, info, DEMO_AGREEMENT, since=asked - 0.5)
    if verdicts:
        wire.say("   ds's new verdict (keys masked):")
        wire.say(show_body(mask_verdict_keys(verdicts[-1].get("answer"))))
    why = check_verdict(verdicts[-1].get("answer"), left_pods, left_dids) if verdicts else "ds was not asked"
    ok = r.status_code == 200 and got == left_pods and got < pods and why is None
    detail = f"{r.status_code}, pods {sorted(got)} (were {sorted(pods)})"
    result.add(STEPS[6], ok, detail + (f"; {why}" if why else ""))


async def _suspend(wire: Wire, info: StackInfo, result: StoryResult, cp: str, flow: PullAddress) -> None:
    replicas = info.gateway_urls
    wire.say(
        f"\n7. The control plane suspends the flow; the same token on each of the {len(replicas)}"
        " gateway replicas"
    )
    s = await signal(wire, info, cp, flow.flow_id, "suspend")
    result.add(STEPS[7], 200 <= s.status_code < 300, f"{s.status_code}")
    answers = []
    for gateway in replicas:
        again = await pull(wire, f"{gateway}/dps/public", flow.token)
        body = _json_or_text(again)
        code = body.get("error") if isinstance(body, dict) else None
        answers.append((gateway, again.status_code, code, isinstance(body, dict) and "items" in body))
    refused = all(st == 401 and code == "pull_token" and not items for _, st, code, items in answers)
    ok = len(replicas) >= 2 and refused
    detail = ", ".join(f"{g}: {st} {code}" for g, st, code, _ in answers)
    if len(replicas) < 2:
        detail += " (one replica only: start the stack with `up --gateways 2`)"
    result.add(STEPS[8], ok, detail)


async def _person_path(wire: Wire, info: StackInfo, result: StoryResult) -> None:
    promised = member_pods()
    wire.say(
        "\n8. The person path on the normal API: each REC member reads the meters the registry lists as"
        f" theirs (catalogue: person layer rec_registry over pod); promised {_sorted_map(promised)}"
    )
    got: dict[str, set[str]] = {}
    statuses = []
    for name in sorted(promised):
        token = await user_token(
            wire,
            info,
            {
                "sub": f"u-{name}",
                "preferred_username": name,
                "organization": {"rec-demo": {"type": ["rec"], "groups": ["/viewers"]}},
            },
        )
        r = await wire.call(
            "POST",
            f"{info.gateway_urls[-1]}/query",
            json_body={"sql": DEMO_SQL},
            headers={"Authorization": f"Bearer {token}"},
        )
        statuses.append(r.status_code)
        got[name] = rows_pods(r) if r.status_code == 200 else set()
    ok = all(s == 200 for s in statuses) and got == promised
    result.add(STEPS[9], ok, f"{statuses}, {_sorted_map(got)}")


def _sorted_map(m: dict[str, set[str]]) -> str:
    return ", ".join(f"{k}: {sorted(v)}" for k, v in sorted(m.items()))


async def run_story(info: StackInfo, out: Callable[[str], None] | None = print) -> StoryResult:
    result = StoryResult()
    pods, dids = consenting()
    withdrawer = sorted(dids)[-1]
    async with httpx.AsyncClient(timeout=30.0) as http:
        wire = Wire(http, out)
        withdrawn = False
        try:
            every = await _table(wire, info, result)
            await _admin(wire, info, result, every)

            wire.say("\n2. A control plane authenticates and starts a DPS pull flow on signaling")
            # the demo starts from ds's configured consents, whatever a run cut short left behind
            await wait_out_ds_cache(wire, info, DEMO_AGREEMENT)
            cp = await control_plane_token(wire, info)
            flow = result.flow = await start_pull_flow(wire, info, cp, transfer_type=HTTP_PULL_PROFILE)
            result.add(STEPS[2], True, f"flow {flow.flow_id} STARTED; data address {flow.endpoint}")

            wire.say(f"\n3. The consumer pulls with the pull token; consents at ds cover {sorted(pods)}")
            asked = time.time()
            r = await pull(wire, flow.endpoint, flow.token, transfer_id=flow.flow_id)
            got = rows_pods(r) if r.status_code == 200 else set()
            ok = r.status_code == 200 and got == pods
            if not result.add(STEPS[3], ok, f"{r.status_code}, pods {sorted(got)} of {sorted(every)}"):
                return result

            wire.say("\n4. ds's verdict for that pull: the gateway's question, ds's answer (keys masked)")
            verdicts = await ds_verdicts(wire, info, DEMO_AGREEMENT, since=asked - 0.5)
            if verdicts:
                wire.say(show_body(verdicts[-1]["body"]))
                wire.say("   ←")
                wire.say(show_body(mask_verdict_keys(verdicts[-1].get("answer"))))
            why = check_verdict(verdicts[-1].get("answer"), pods, dids) if verdicts else "ds was not asked"
            result.add(STEPS[4], why is None, why or f"allow, subject_key_match over {len(pods)} keys")

            wire.say(
                "\n5. The disclosure arrives at ds (gateway → Kafka → audit relay), naming subject DIDs only."
                "\n   user_id and subject_id are always null: the caller is a dataspace participant"
                "\n   (consumer_id, its DID), not a person, and the persons whose rows left are named only"
                "\n   by the DIDs ds itself put in its filter (authorized_subject_ids, RF-10) — a"
                "\n   username, a key or a token never leaves in a disclosure (RF-08)"
            )
            calls = await audit_calls(wire, info, [flow.flow_id])
            why = check_disclosure(calls, dids, [*pods, "pod:"])
            result.add(STEPS[5], why is None, why or f"subjects {sorted(dids)}")

            withdrawn = True
            await _withdraw(wire, info, result, flow, withdrawer)
            await _suspend(wire, info, result, cp, flow)
            await _person_path(wire, info, result)
        except DemoFailure as exc:
            result.add("story", False, str(exc))
        except (httpx.HTTPError, OSError, asyncpg.PostgresError) as exc:
            result.add("story", False, f"{type(exc).__name__}: {exc}")
        finally:
            if withdrawn:
                wire.say(f"\n   (the demo grants {withdrawer}'s consent again, leaving ds as it found it)")
                try:
                    await set_consent(wire, info, withdrawer, withdrawn=False)
                except (DemoFailure, httpx.HTTPError) as exc:
                    result.add("restore consent", False, str(exc))
    return result


def main(root: Path) -> int:
    try:
        info = StackInfo.load(root)
    except DemoFailure as exc:
        print(exc)
        return 2
    print("The dataspace story, against the local stack (tokens shortened and redacted, ds's keys masked)")
    result = asyncio.run(run_story(info))
    print("\nSummary:")
    for name, ok, detail in result.steps:
        print(f"  [{'ok' if ok else 'FAILED'}] {name}: {detail}")
    print("the story holds end to end" if result.ok else "the story does NOT hold (see above)")
    return 0 if result.ok else 1
