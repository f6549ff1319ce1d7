"""`dataplane-local demo`: the dataspace story told against a running local stack, one real HTTP
request at a time (method, URL, status, trimmed body; every token shortened).

1. a control plane takes a client-credentials token from the OIDC issuer double;
2. it starts a DPS pull flow on signaling (`POST /dps/v1/dataflows/start`) and gets a data address;
3. the consumer pulls with the address's token (`POST {endpoint}/query`) and gets only the rows of
   the supply points whose subjects consented (read from `ds-policy.yaml`);
4. the ds connector double received the disclosure (`/_calls`), naming subject DIDs only;
5. the control plane suspends the flow, and the same pull with the same token is refused (401).

The step functions are also what `tests/e2e` drive, so the story printed here is the one asserted."""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

DEPLOY_LOCAL = Path(__file__).resolve().parents[2]
DEMO_AGREEMENT = "agr-demo"
DEMO_CONSUMER = "did:web:consumer.example"
DEMO_PROVIDER = "did:web:provider.example"
DEMO_DATASET = "meter_readings"
DEMO_SQL = "SELECT pod, count(*) AS readings FROM meter_readings GROUP BY pod ORDER BY pod"
TOKEN_PATH = "/protocol/openid-connect/token"
_JWT = re.compile(r"eyJ[\w-]+\.[\w-]+\.[\w-]*")
_SECRET_KEYS = {"access_token", "refresh_token", "id_token", "token", "client_secret"}
_TRIM = 600


class DemoFailure(RuntimeError):
    """A step's answer was not the expected one."""


def redact(text: str) -> str:
    """Every JWT shortened to its first characters, so nothing printed can be replayed."""
    return _JWT.sub(lambda m: m.group(0)[:10] + "…(redacted)", text)


def _redact_json(value: Any) -> Any:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            if k in _SECRET_KEYS and isinstance(v, str):
                out[k] = v[:6] + "…(redacted)"
            elif k.endswith("authorization") and isinstance(v, str):
                out[k] = redact(v) if _JWT.search(v) else "…(redacted)"
            else:
                out[k] = _redact_json(v)
        return out
    if isinstance(value, list):
        return [_redact_json(v) for v in value]
    return redact(value) if isinstance(value, str) else value


def show_body(body: Any) -> str:
    if body is None:
        return ""
    text = json.dumps(_redact_json(body), separators=(",", ":"), default=str, ensure_ascii=False)
    return text if len(text) <= _TRIM else text[:_TRIM] + f"… ({len(text)} chars)"


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
            sent = json_body if json_body is not None else _redact_json(form) if form else None
            if sent is not None:
                self.out(f"      {show_body(sent)}")
            self.out(f"  ← {response.status_code}  {show_body(_json_or_text(response))}")
        return response


def _json_or_text(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text[:_TRIM] if response.text else None


def consenting(policy_path: Path | None = None, agreement: str = DEMO_AGREEMENT) -> tuple[set[str], set[str]]:
    """(pods, subject DIDs) of the live consents behind the agreement's dataset, from the policy
    file the ds double serves: the rows the consumer must get, and the DIDs ds must be told."""
    policy = yaml.safe_load((policy_path or DEPLOY_LOCAL / "ds-policy.yaml").read_text())
    pods: set[str] = set()
    dids: set[str] = set()
    for entry in policy["agreements"][agreement]["datasets"]:
        for grant in policy["consents"].get(entry.get("consent"), []):
            if not grant.get("withdrawn"):
                dids.add(grant["subject_did"])
                pods.update(k.split(":", 1)[1] for k in grant.get("keys", []))
    return pods, dids


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


@dataclass(frozen=True)
class PullAddress:
    flow_id: str
    endpoint: str
    token: str


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
) -> PullAddress:
    flow_id = flow_id or f"flow-{uuid.uuid4().hex[:12]}"
    message = {
        "messageId": str(uuid.uuid4()),
        "dataFlowId": flow_id,
        "participantId": provider,
        "counterPartyId": consumer,
        "agreementId": agreement,
        "datasetId": dataset,
        "transferType": "HttpData-PULL",
    }
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


async def audit_calls(
    wire: Wire, info: StackInfo, transfer_ids: Iterable[str], timeout: float = 30.0, show: bool = True
) -> list[dict[str, Any]]:
    """The ds double's recorded audit posts for these transfer ids, waited for (at least once
    delivery is asynchronous: gateway → Kafka → audit-relay → ds)."""
    wanted = set(transfer_ids)
    deadline = time.monotonic() + timeout
    while True:
        r = await wire.http.get(f"{info.ds_url}/_calls", params={"endpoint": "audit"})
        r.raise_for_status()
        calls = [
            c for c in r.json() if isinstance(c.get("body"), dict) and c["body"].get("transfer_id") in wanted
        ]
        seen = {c["body"]["transfer_id"] for c in calls if 200 <= c["status"] < 300}
        if seen >= wanted or time.monotonic() > deadline:
            if show and wire.out is not None:
                wire.out(f"  → GET {info.ds_url}/_calls?endpoint=audit")
                wire.out(f"  ← {r.status_code}  {show_body([c['body'] for c in calls])}")
            return calls
        await asyncio.sleep(0.2)


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
        text = json.dumps({k: v for k, v in body.items() if k != "authorized_subject_ids"})
        leaked = [f for f in forbidden if f in text]
        if leaked or _JWT.search(text):
            return "the disclosure carries a key, principal or token"
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


async def run_story(info: StackInfo, out: Callable[[str], None] | None = print) -> StoryResult:
    result = StoryResult()
    say = out or (lambda _s: None)
    pods, dids = consenting()
    async with httpx.AsyncClient(timeout=30.0) as http:
        wire = Wire(http, out)
        try:
            say("\n1. The control plane authenticates (client credentials at the OIDC issuer)")
            cp = await control_plane_token(wire, info)
            result.add("control plane token", True, "client-credentials token issued")

            say("\n2. The control plane starts a DPS pull flow on signaling")
            flow = result.flow = await start_pull_flow(wire, info, cp)
            result.add("start pull flow", True, f"flow {flow.flow_id} STARTED; data address {flow.endpoint}")

            say(f"\n3. The consumer pulls with the pull token; consents cover {sorted(pods)}")
            transfer = f"tp-{uuid.uuid4().hex[:12]}"
            r = await pull(wire, flow.endpoint, flow.token, transfer_id=transfer)
            got = rows_pods(r) if r.status_code == 200 else set()
            ok = r.status_code == 200 and got == pods
            if not result.add("pull serves consenting rows only", ok, f"{r.status_code}, pods {sorted(got)}"):
                return result

            say("\n4. ds receives the disclosure (via Kafka and the audit relay), naming DIDs only")
            calls = await audit_calls(wire, info, [transfer])
            why = check_disclosure(calls, dids, [*pods, "pod:"])
            result.add("ds got a DID-only disclosure", why is None, why or f"subjects {sorted(dids)}")

            say("\n5. The control plane suspends the flow; the same pull is refused")
            s = await signal(wire, info, cp, flow.flow_id, "suspend")
            result.add("suspend", 200 <= s.status_code < 300, f"{s.status_code}")
            again = await pull(wire, flow.endpoint, flow.token)
            code = _json_or_text(again)
            ok = again.status_code == 401 and "items" not in (code if isinstance(code, dict) else {})
            result.add("pull after suspend refused", ok, f"{again.status_code} {show_body(code)}")
        except DemoFailure as exc:
            result.add("story", False, str(exc))
        except httpx.HTTPError as exc:
            result.add("story", False, f"HTTP failure: {type(exc).__name__}: {exc}")
    return result


def main(root: Path) -> int:
    try:
        info = StackInfo.load(root)
    except DemoFailure as exc:
        print(exc)
        return 2
    print("The dataspace story, against the local stack (tokens are shortened and redacted)")
    result = asyncio.run(run_story(info))
    print("\nSummary:")
    for name, ok, detail in result.steps:
        print(f"  [{'ok' if ok else 'FAILED'}] {name}: {detail}")
    print("the story holds end to end" if result.ok else "the story does NOT hold (see above)")
    return 0 if result.ok else 1
