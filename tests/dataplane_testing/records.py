"""Support of the records API tests (docs/records.md): a datasets database of transactions, a
flows database migrated by the real `signaling-migrate`, signaling running with its own copy of
the catalogue (rewritten by a test to change the declaration after a flow started), and a DPS
gateway reading both. Signaling's own helpers are reused from `dataplane_testing.signaling`."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from . import signaling as signaling_support
from .databases import create_database, drop_database, scratch_database
from .gateway import AGREEMENT, CONSUMER, PROVIDER, World, ds_policy, running_gateway

CATALOGUE = Path(__file__).parents[1] / "query_gateway" / "records_catalogue.yaml"
CURSOR_SECRET = "records-cursor-secret-0123456789abcdef"
PROFILE = "https://pdpp.dev/profiles/client-range-filters/0.1-experimental"

# amounts straddle binary floating point (0.1 + 0.2 is 0.30000000000000004 as a double) and
# quantities pass 2**53 (9007199254740992), where a double can no longer tell n from n + 1
SEED = """
CREATE TABLE transactions (
    id bigint PRIMARY KEY, subject text NOT NULL, amount numeric, qty bigint,
    posted_on date, posted_at timestamptz, memo text, hidden_score int
);
INSERT INTO transactions VALUES
 (1, 's1', 0.3, 10, '2024-01-01', '2024-01-01T00:00:00Z', 'a', 1),
 (2, 's1', 0.30000000000000004, 9007199254740993, '2024-01-02', '2024-01-02T12:00:00.000001Z', 'b', 2),
 (3, 's1', 0.1, 9007199254740992, '2024-01-03', '2024-01-03T00:00:00+02:00', 'c', 3),
 (4, 's1', NULL, NULL, NULL, NULL, NULL, NULL),
 (5, 's2', 0.2, 5, '2024-01-02', '2024-01-02T00:00:00Z', 'e', 5),
 (6, 's1', -5, -1, '2023-12-31', '2023-12-31T23:59:59.999999Z', 'f', 6),
 (7, 's1', 12345678901234567890.5, 20, '2024-02-01', '2024-02-01T00:00:00Z', 'g', 7);
"""
SUBJECTS = {"s1": "did:web:s1.example", "s2": "did:web:s2.example"}
SKM = {"handler": "subject_key_match", "args": {"column": "subject", "key_type": "acct"}}


def consent_policy(subjects: list[str], dataset: str = "transactions") -> dict[str, Any]:
    """ds's policy: the consumer's agreement over `dataset`, consented by these subjects."""
    consent = [{"subject_did": SUBJECTS[s], "keys": [f"acct:{s}"], "principals": [s]} for s in subjects]
    return ds_policy([{"dataset_id": dataset, "row_filter": dict(SKM), "consent": "c"}], {"c": consent})


def declaration(range_filters: dict[str, Any] | None = None, drop: bool = False) -> dict[str, Any]:
    """The test catalogue, its transactions' range filters replaced (or `records:` dropped)."""
    catalogue: dict[str, Any] = yaml.safe_load(CATALOGUE.read_text())
    entry = catalogue["datasets"][0]
    if drop:
        del entry["records"]
    elif range_filters is not None:
        entry["records"]["range_filters"] = range_filters
    return catalogue


@dataclass
class RecordsWorld:
    gateway: httpx.AsyncClient
    signaling: httpx.AsyncClient
    flows_url: str
    catalogue_path: Path  # signaling's copy
    cp_token: str
    datasets_url: str
    public_pem: str  # signaling's token key, as the gateway verifies with it
    # every gateway replica over the same databases (the first is `gateway`)
    replicas: tuple[httpx.AsyncClient, ...] = ()

    def declare(self, catalogue: dict[str, Any]) -> None:
        """Signaling's catalogue as it is from now on (read again on the next start)."""
        self.catalogue_path.write_text(yaml.safe_dump(catalogue))

    async def start(self, filters: object = True, dataset: str = "transactions") -> tuple[str, str]:
        """A provider pull flow started through signaling; (flow id, pull token). `filters` is
        the start's `metadata.pdpp_range_filters` (left out when None)."""
        flow = f"flow-{uuid.uuid4().hex[:12]}"
        metadata = {} if filters is None else {"pdpp_range_filters": filters}
        msg = signaling_support.start_message(
            flow,
            participantId=PROVIDER,
            counterPartyId=CONSUMER,
            agreementId=AGREEMENT,
            datasetId=dataset,
            metadata=metadata,
        )
        r = await self.signaling.post(
            f"{signaling_support.FLOWS}/start", json=msg, headers=signaling_support.auth(self.cp_token)
        )
        assert r.status_code == 200, r.text
        return flow, signaling_support.token_of(r.json())

    async def signal(self, flow: str, signal: str, body: dict[str, Any] | None = None) -> str | None:
        """A transition signalled by the control plane; the new pull token, if one was issued."""
        r = await self.signaling.post(
            f"{signaling_support.FLOWS}/{flow}/{signal}",
            json=body or {},
            headers=signaling_support.auth(self.cp_token),
        )
        assert r.status_code in (200, 204), r.text
        body = r.json() if r.content else {}
        return signaling_support.token_of(body) if body.get("dataAddress") else None

    async def set_extensions(self, flow: str, extensions: object) -> None:
        """The flow's stored grant extensions replaced: a grant signaling would never issue."""
        conn = await asyncpg.connect(self.flows_url)
        try:
            await conn.execute(
                "UPDATE dps_data_flows SET grant_extensions = $2::json WHERE id = $1",
                flow,
                json.dumps(extensions),
            )
        finally:
            await conn.close()

    async def records(
        self, token: str, query: list[tuple[str, Any]] | str = "", dataset: str = "transactions"
    ) -> httpx.Response:
        return await self.gateway.get(
            f"/dps/public/streams/{dataset}/records",
            params=query or None,
            headers={"Authorization": f"Bearer {token}"},
        )

    async def metadata(self, token: str, dataset: str = "transactions", query: str = "") -> httpx.Response:
        return await self.gateway.get(
            f"/dps/public/streams/{dataset}{query}", headers={"Authorization": f"Bearer {token}"}
        )


def _public_pem(key: ec.EllipticCurvePrivateKey) -> str:
    return (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )


async def _migrated_flows(postgres_url: str) -> str:
    await signaling_support.ensure_pull_grant_role(postgres_url)
    url = await create_database(postgres_url, "records_flows_")
    done = signaling_support.run_migrate(url, "upgrade", "head")
    assert done.returncode == 0, done.stderr
    return url


@contextlib.asynccontextmanager
async def records_world(
    world: World,
    postgres_url: str,
    directory: Path,
    *,
    catalogue: Path = CATALOGUE,
    seed: str = SEED,
    replicas: int = 1,
) -> AsyncIterator[RecordsWorld]:
    """Signaling and `replicas` DPS gateways over one migrated flows database and one datasets
    database seeded with `seed`; the gateways read `catalogue`, signaling a copy of it in
    `directory`."""
    key = ec.generate_private_key(ec.SECP256R1())
    flows_url = await _migrated_flows(postgres_url)
    sig_catalogue = directory / "signaling-catalogue.yaml"
    sig_catalogue.write_text(catalogue.read_text())  # noqa: ASYNC240 - a small file, once per module
    values = signaling_support.settings_values(
        flows_url, world.kafka, world.issuer.base_url, signaling_support.pem_of(key)
    )
    values.update(catalogue_path=str(sig_catalogue), outbox_relay_enabled=False)
    cp_token = world.issuer.mint(
        {"azp": signaling_support.CP, "gty": "client-credentials"}, audience=signaling_support.AUDIENCE
    )
    try:
        async with scratch_database(postgres_url, seed) as datasets_url, contextlib.AsyncExitStack() as stack:
            settings = world.settings(
                catalogue_path=str(catalogue),
                datasets_database_url=datasets_url,
                dps_enabled=True,
                dps_token_public_key=_public_pem(key),
                dps_flows_database_url=flows_url,
                records_cursor_secret=CURSOR_SECRET,
            )
            sig = await stack.enter_async_context(signaling_support.run_app(values))
            gateways = [await stack.enter_async_context(running_gateway(settings)) for _ in range(replicas)]
            yield RecordsWorld(
                gateways[0],
                sig.client,
                flows_url,
                sig_catalogue,
                cp_token,
                datasets_url,
                _public_pem(key),
                tuple(gateways),
            )
    finally:
        await drop_database(postgres_url, flows_url)


def keys_of(response: httpx.Response) -> list[int]:
    assert response.status_code == 200, response.text
    return [int(item["id"]) for item in response.json()["items"]]
