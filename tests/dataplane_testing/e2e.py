"""The running system for the end-to-end tests: the local stack (every service a real process, two
gateway replicas, two resolvers, its OTLP receiver's span store), and small clients for the doubles and the
broker."""

from __future__ import annotations

import asyncio
import copy
import json
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from aiokafka import AIOKafkaConsumer

from dataplane_local.demo import DEMO_AGREEMENT, DEMO_CONSUMER, StackInfo
from dataplane_local.stack import DEPLOY_LOCAL, Stack
from dataplane_local.traces import StoredSpans

from .polling import eventually
from .topics import partitions_of

# alice owns meters on these pods in deploy/local/rec-registry.yaml (the resolver's lookup answer)
ALICE_USER_ID = "u-alice"
ALICE_PODS = {"IT001E00000001", "IT001E00000003"}
ALL_PODS = {"IT001E00000001", "IT001E00000002", "IT001E00000003", "IT001E00000004"}
POD_SQL = "SELECT DISTINCT pod FROM meter_readings ORDER BY pod"

# GS-14 across replicas: a dataset of its own with a small bucket, so no other test meets the
# limit (two reads, then one token every two seconds per consumer)
LIMITED_DATASET = "limited_readings"
LIMITED = f"""
  - id: {LIMITED_DATASET}
    table: public.meter_readings
    access_level: restricted  # no anonymous reader: the stack's other answers stay as they were
    expose: true
    dataspace_expose: true
    rate_limit: {{per_second: 0.5, burst: 2}}
    row_filters:
      person: {{handler: allow_all, binds: person}}
      organization: {{handler: allow_all, binds: organization}}
"""


def e2e_catalogue(directory: Path) -> Path:
    """The local stack's catalogue plus the limited dataset."""
    path = directory / "catalogue.yaml"
    path.write_text((DEPLOY_LOCAL / "catalogue.yaml").read_text().rstrip("\n") + "\n" + LIMITED)
    return path


@dataclass
class System:
    stack: Stack
    info: StackInfo
    receiver: StoredSpans
    root: Path
    http: httpx.AsyncClient
    kafka: AIOKafkaConsumer
    policy: dict[str, Any] = field(default_factory=dict)

    # --------------------------------------------------------------------- service instances
    @property
    def gateways(self) -> list[str]:
        return self.info.gateway_urls

    @property
    def resolvers(self) -> list[str]:
        return ["filter-resolver", "filter-resolver-2"]

    def instance_urls(self) -> dict[str, str]:
        """Every service process by instance name → its base URL."""
        return {name: f"http://127.0.0.1:{env['HTTP_PORT']}" for name, env in self.stack.service_envs.items()}

    def audited(self, instance: str, action: str, reason: str) -> int:
        """How many GS-02 refusal records with this action and reason the instance has written
        (its log in the stack's state directory: one JSON line each)."""
        count = 0
        for line in (self.stack.logs / f"{instance}.log").read_text(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line of the server's own (start-up banner)
            if isinstance(record, dict) and (record.get("action"), record.get("reason")) == (action, reason):
                count += 1
        return count

    # --------------------------------------------------------------------------- ds double
    async def ds_control(self, body: dict[str, Any]) -> Any:
        r = await self.http.post(f"{self.info.ds_url}/_control", json=body)
        assert r.status_code == 200, r.text
        return r.json()

    async def add_agreement(self, dataset_entry: dict[str, Any], name: str | None = None) -> str:
        """A new agreement for the demo consumer over one dataset verdict; the policy is replaced
        as a whole (the double keeps its signing key, so earlier tokens stay valid)."""
        name = name or f"agr-{uuid.uuid4().hex[:10]}"
        self.policy["agreements"][name] = {"consumer": DEMO_CONSUMER, "datasets": [dataset_entry]}
        await self.ds_control({"action": "policy", "policy": self.policy})
        return name

    async def edr_token(self, agreement: str) -> str:
        body = await self.ds_control(
            {"action": "mint_edr", "consumer": DEMO_CONSUMER, "agreement": agreement}
        )
        return str(body["token"])

    async def edr_query(
        self,
        agreement: str,
        *,
        gateway: str | None = None,
        sql: str = POD_SQL,
        transfer_id: str | None = None,
        traceparent: str | None = None,
        token: str | None = None,
    ) -> httpx.Response:
        """`POST /query` on the legacy EDR path (an EDR token minted by the ds double)."""
        headers = {
            "Authorization": f"Bearer {token or await self.edr_token(agreement)}",
            "Edc-Contract-Agreement-Id": agreement,
        }
        if transfer_id:
            headers["Edc-Transfer-Process-Id"] = transfer_id
        if traceparent:
            headers["traceparent"] = traceparent
        return await self.http.post(
            f"{gateway or self.gateways[0]}/query", json={"sql": sql}, headers=headers
        )

    async def audit_transfer_ids(self) -> set[str]:
        r = await self.http.get(f"{self.info.ds_url}/_calls", params={"endpoint": "audit"})
        r.raise_for_status()
        return {
            c["body"]["transfer_id"]
            for c in r.json()
            if isinstance(c.get("body"), dict) and 200 <= c["status"] < 300 and c["body"].get("transfer_id")
        }

    async def delivered(self, transfers: set[str], timeout: float = 60.0) -> set[str]:
        """Which of these transfers' disclosures ds has accepted, once all of them are or the
        (scaled) timeout has passed."""
        got: set[str] = set()

        async def all_delivered() -> bool:
            nonlocal got
            got = await self.audit_transfer_ids() & transfers
            return got == transfers

        await eventually(all_delivered, timeout, 0.25)
        return got

    # ------------------------------------------------------------------------------ broker
    async def end_offset(self, topic: str) -> int:
        """Sum of the topic's end offsets: how many records were ever published to it."""
        partitions = await partitions_of(self.kafka, topic)
        assert partitions, f"topic {topic} has no partitions"
        ends = await self.kafka.end_offsets(partitions)
        return sum(ends.values())


async def local_cli(root: Path, *args: str, timeout: float = 180) -> tuple[int, str]:
    """`dataplane-local --dir ROOT ARGS...` as a user runs it: (exit status, stdout and stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "dataplane_local.cli",
        "--dir",
        str(root),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode is not None
    return proc.returncode, out.decode()


def demo_policy() -> dict[str, Any]:
    """The ds double's policy as `up` configured it (deploy/local/ds-policy.yaml)."""
    policy: dict[str, Any] = yaml.safe_load((DEPLOY_LOCAL / "ds-policy.yaml").read_text())
    assert DEMO_AGREEMENT in policy["agreements"]
    return copy.deepcopy(policy)


def rec_registry_verdict(*principals: str, dids: list[str] | None = None) -> dict[str, Any]:
    """A verdict whose person layer is the lookup handler `rec_registry`, delegated: the resolver
    asks the REC registry for the meters of the named members (RF-05)."""
    return {
        "dataset_id": "meter_readings",
        "decision": "allow",
        "row_filter": {
            "handler": "rec_registry",
            "args": {"column": "pod"},
            "principals": list(principals),
            "subject_dids": dids if dids is not None else ["did:web:alice.example"],
        },
        "organizations": ["rec-demo"],
    }


def fresh_principals() -> tuple[str, str]:
    """alice plus an id the registry does not know: the same rows, but a plan-cache key never seen
    before (the key covers the principals), so the first query is a guaranteed cache miss."""
    return ALICE_USER_ID, f"u-nobody-{uuid.uuid4().hex[:10]}"


def pods_of(response: httpx.Response) -> set[str]:
    return {str(item["pod"]) for item in response.json()["items"]}


def new_traceparent() -> tuple[str, str]:
    trace_id = uuid.uuid4().hex
    return trace_id, f"00-{trace_id}-{uuid.uuid4().hex[:16]}-01"
