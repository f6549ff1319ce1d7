"""Found by schemathesis (issue 14): a message holding text PostgreSQL cannot store — a NUL, a
lone surrogate — is the caller's mistake, answered 422 `invalid_message` before anything is
stored, never 503 `database_unavailable` (nor a 500)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from dataplane_testing import signaling as support

BAD_TEXT = ["nul\x00inside", "lone \ud800 surrogate"]


def _json(body: dict[str, Any]) -> bytes:
    import json

    return json.dumps(body).encode()  # ensure_ascii: the surrogate travels as \ud800, as JSON allows


@pytest.mark.parametrize("text", BAD_TEXT, ids=["nul", "surrogate"])
async def test_dps03_control_plane_registration_with_untext_is_422(
    signaling: Any, cp_token: Callable[..., str], text: str
) -> None:
    r = await signaling.client.put(
        "/dps/v1/controlplanes",
        content=_json({"controlplaneId": f"cp-{text}", "endpoint": "https://cp.example"}),
        headers={**support.auth(cp_token()), "Content-Type": "application/json"},
    )
    assert r.status_code == 422, r.text
    assert r.json()["error"] == "invalid_message"


@pytest.mark.parametrize("text", BAD_TEXT, ids=["nul", "surrogate"])
async def test_dps03_start_with_untext_is_422_and_stores_nothing(
    signaling: Any, cp_token: Callable[..., str], flows_db: str, text: str
) -> None:
    flow = support.new_id()
    r = await signaling.client.post(
        f"{support.FLOWS}/start",
        content=_json(support.start_message(flow, participantId=f"did:web:{text}")),
        headers={**support.auth(cp_token()), "Content-Type": "application/json"},
    )
    assert r.status_code == 422, r.text
    assert r.json()["error"] == "invalid_message"
    assert await support.sql(flows_db, "SELECT id FROM dps_data_flows") == []


async def test_dps08_a_flow_id_holding_a_nul_is_422_not_a_lost_database(
    signaling: Any, cp_token: Callable[..., str]
) -> None:
    r = await signaling.client.get(f"{support.FLOWS}/flow%00x/status", headers=support.auth(cp_token()))
    assert r.status_code == 422, r.text
    assert r.json()["error"] == "invalid_message"
