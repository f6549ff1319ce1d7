"""Metrics: flows by state, signals by outcome, pull tokens issued and retired (/metrics)."""

from __future__ import annotations

import asyncio
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from signaling_support import FLOWS, auth, new_id, run_app, start_message


async def _samples(app: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = (await app.client.get("/metrics")).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_signals_tokens_and_flows_are_counted(base_settings: dict[str, Any], cp_token: Any) -> None:
    async with run_app({**base_settings, "flow_metrics_interval_seconds": 0}) as app:
        before = await _samples(app)
        h = auth(cp_token())
        flow = new_id()
        await app.client.post(f"{FLOWS}/start", json=start_message(flow), headers=h)
        await app.client.post(f"{FLOWS}/start", json=start_message(flow), headers=h)  # 409
        await app.client.post(f"{FLOWS}/{flow}/suspend", headers=h)
        await app.client.post(f"{FLOWS}/{flow}/resume", headers=h)
        await app.client.post(f"{FLOWS}/{flow}/terminate", headers=h)
        await app.client.post(f"{FLOWS}/prepare", json=start_message(new_id()), headers=h)

        def delta(name: str, **labels: str) -> float:
            key = (name, tuple(sorted(labels.items())))
            return after.get(key, 0.0) - before.get(key, 0.0)

        after = await _samples(app)
        assert delta("signaling_signals_total", signal="start", outcome="ok") == 1
        assert delta("signaling_signals_total", signal="start", outcome="flow_exists") == 1
        assert delta("signaling_signals_total", signal="suspend", outcome="ok") == 1
        assert delta("signaling_pull_tokens_issued_total") == 2
        assert delta("signaling_pull_tokens_retired_total") == 2
        for _ in range(50):  # the gauge is refreshed by the relay loop
            after = await _samples(app)
            terminated = after.get(("signaling_flows", (("state", "TERMINATED"),)))
            prepared = after.get(("signaling_flows", (("state", "PREPARED"),)))
            if terminated == 1 and prepared == 1:
                break
            await asyncio.sleep(0.1)
        assert (terminated, prepared) == (1, 1)
