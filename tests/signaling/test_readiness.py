"""/readyz checks the flows database and the broker; the 503 names the failing dependency."""

from __future__ import annotations

from typing import Any

import asyncpg
import httpx

from dataplane_testing.polling import wait_for
from dataplane_testing.signaling import run_app


async def test_readyz_names_a_lost_database(base_settings: dict[str, Any], postgres_url: str) -> None:
    async with run_app(base_settings) as app:
        ok = await app.client.get("/readyz")
        assert ok.status_code == 200 and ok.json() == {"status": "ready"}
        name = base_settings["database_url"].rpartition("/")[2]
        admin = await asyncpg.connect(postgres_url)
        try:
            await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        finally:
            await admin.close()
        # a kept answer (1.5 s, docs/faults.md, `/readyz`) may still say ready: asked again
        await wait_for(lambda: _unready(app.client), 30, "unready")
        lost = await app.client.get("/readyz")
        assert lost.status_code == 503
        assert lost.json()["failing"] == ["database"]
        assert name not in lost.text


async def _unready(client: httpx.AsyncClient) -> bool:
    return (await client.get("/readyz")).status_code == 503
