"""Issue 15's limits on the records route (docs/records.md) against real signaling, PostgreSQL,
Redis, broker and the ds double: a second DPS gateway over the same flows reads a catalogue whose
`transactions` declares `max_rows` and a `rate_limit`. Its records pages are capped at the
dataset's `max_rows` (the page's `limit` says so) and still page through every record with the
cursor (QE-07); the pull's consumer is refused `429 rate_limited` with `Retry-After` once its
burst is spent (GS-14), while the gateway whose catalogue sets no limit serves the same flow."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import yaml

from dataplane_local.doubles.ds_connector import DsConnectorDouble
from dataplane_testing.faults import coded
from dataplane_testing.gateway import World, running_gateway
from dataplane_testing.records import CURSOR_SECRET, RecordsWorld, consent_policy, declaration, keys_of

MAX_ROWS = 2
BURST = 4  # one token every 5 s after it: the test's reads are over well within that


@pytest.fixture(scope="module")
async def limited(
    rw: RecordsWorld, world: World, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[httpx.AsyncClient]:
    catalogue: dict[str, Any] = declaration()
    catalogue["datasets"][0]["max_rows"] = MAX_ROWS
    catalogue["datasets"][0]["rate_limit"] = {"per_second": 0.2, "burst": BURST}
    path = tmp_path_factory.mktemp("records-limits") / "catalogue.yaml"
    path.write_text(yaml.safe_dump(catalogue))
    settings = world.settings(
        catalogue_path=str(path),
        datasets_database_url=rw.datasets_url,
        dps_enabled=True,
        dps_token_public_key=rw.public_pem,
        dps_flows_database_url=rw.flows_url,
        records_cursor_secret=CURSOR_SECRET,
    )
    async with running_gateway(settings) as client:
        yield client


async def test_qe07_gs14_records_pages_are_capped_and_the_consumer_is_rate_limited(
    rw: RecordsWorld, limited: httpx.AsyncClient, ds: DsConnectorDouble
) -> None:
    rw.declare(declaration())
    ds.set_policy(consent_policy(["s1", "s2"]))
    _, token = await rw.start()
    headers = {"Authorization": f"Bearer {token}"}
    url = "/dps/public/streams/transactions/records"
    every = keys_of(await rw.records(token, [("limit", "100")]))  # the unlimited gateway: one page
    assert len(every) > MAX_ROWS

    seen: list[int] = []
    cursor = None
    for _ in range(BURST):  # the burst: capped pages, following the cursor
        query = [("limit", "100")] + ([("cursor", cursor)] if cursor else [])
        r = await limited.get(url, params=query, headers=headers)
        body = r.json()
        assert r.status_code == 200 and body["limit"] == MAX_ROWS and len(body["items"]) <= MAX_ROWS, r.text
        seen += keys_of(r)
        cursor = body["next_cursor"]
    # seven records: every one once, in key order, MAX_ROWS a page, the fourth page the last
    assert (seen, cursor) == (every, None) and len(every) == 7

    r = await limited.get(url, params=[("limit", "100")], headers=headers)
    assert coded(r) == (429, "rate_limited") and int(r.headers["Retry-After"]) >= 1, r.text
    # the gateway whose catalogue sets no limit serves the same flow meanwhile
    assert keys_of(await rw.records(token, [("limit", "100")])) == every
