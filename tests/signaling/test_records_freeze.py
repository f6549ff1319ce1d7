"""Signaling's half of the records API (docs/records.md, "The frozen set"): a pull start asking
for range filters stores the dataset's declared filters with the flow, the pull-grant view shows
them, and a catalogue that cannot be read refuses the start that needs it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dataplane_testing.signaling import FLOWS, auth, live_grants, new_id, run_app, start_message

PROFILE = "https://pdpp.dev/profiles/client-range-filters/0.1-experimental"
CATALOGUE = """
datasets:
  - id: dataset-1
    table: tx
    row_filters:
      person: {handler: allow_all, binds: person}
      organization: {handler: allow_all, binds: organization}
    records:
      key: [id]
      range_filters:
        amount: {type: number, ops: [lte, gte]}
"""


async def test_records_a_start_freezes_the_declared_filters_into_the_pull_grant(
    base_settings: dict[str, Any], cp_token: Any, tmp_path: Path
) -> None:
    path = tmp_path / "catalogue.yaml"
    path.write_text(CATALOGUE)
    async with run_app({**base_settings, "catalogue_path": str(path)}) as app:
        asked, plain = new_id(), new_id()
        for flow, metadata in ((asked, {"pdpp_range_filters": True}), (plain, {"pdpp_range_filters": False})):
            r = await app.client.post(
                f"{FLOWS}/start", json=start_message(flow, metadata=metadata), headers=auth(cp_token())
            )
            assert r.status_code == 200, r.text
        grants = {g["flow_id"]: g for g in (await live_grants(base_settings["database_url"])).values()}
        assert json.loads(grants[asked]["grant_extensions"]) == {
            PROFILE: {"streams": {"dataset-1": {"amount": {"type": "number", "ops": ["gte", "lte"]}}}}
        }
        assert grants[plain]["grant_extensions"] is None

        path.write_text("datasets: [")  # broken from now on: no freeze from an older declaration
        r = await app.client.post(
            f"{FLOWS}/start",
            json=start_message(new_id(), metadata={"pdpp_range_filters": True}),
            headers=auth(cp_token()),
        )
        assert r.status_code == 503 and r.json()["error"] == "not_ready", r.text


async def test_records_without_a_catalogue_a_start_asking_for_filters_is_invalid_message(
    signaling: Any, cp_token: Any
) -> None:
    r = await signaling.client.post(
        f"{FLOWS}/start",
        json=start_message(new_id(), metadata={"pdpp_range_filters": True}),
        headers=auth(cp_token()),
    )
    assert r.status_code == 422 and r.json()["error"] == "invalid_message", r.text
