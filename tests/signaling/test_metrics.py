"""Metrics: flows by state, signals by outcome, pull tokens issued and retired (/metrics)."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from dataplane_contracts.dps import FlowState
from dataplane_testing.metrics import sample, scrape
from dataplane_testing.signaling import FLOWS, auth, new_id, run_app, start_message


async def _samples(app: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = (await app.client.get("/metrics")).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_signals_tokens_and_flows_are_counted(base_settings: dict[str, Any], cp_token: Any) -> None:
    async with run_app(base_settings) as app:
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
        # recounted from the database by the scrape itself
        assert after[("signaling_flows", (("state", "TERMINATED"),))] == 1
        assert after[("signaling_flows", (("state", "PREPARED"),))] == 1
        assert after[("signaling_flows", (("state", "STARTED"),))] == 0


def _flows(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> dict[str, float]:
    return {dict(labels)["state"]: v for (name, labels), v in samples.items() if name == "signaling_flows"}


async def test_flows_by_state_are_right_without_an_outbox_relay(
    base_settings: dict[str, Any], cp_token: Any
) -> None:
    """The gauge must not depend on the relay loop: a replica with OUTBOX_RELAY_ENABLED=false
    (the relay runs elsewhere) still reports the flows by state, every state present."""
    async with run_app({**base_settings, "outbox_relay_enabled": False}) as app:
        zero = {state.value: 0.0 for state in FlowState}
        assert _flows(await _samples(app)) == zero
        h = auth(cp_token())
        first, second = new_id(), new_id()
        await app.client.post(f"{FLOWS}/start", json=start_message(first), headers=h)
        await app.client.post(f"{FLOWS}/start", json=start_message(second), headers=h)
        assert _flows(await _samples(app)) == {**zero, "STARTED": 2.0}
        await app.client.post(f"{FLOWS}/{first}/suspend", headers=h)
        await app.client.post(f"{FLOWS}/prepare", json=start_message(new_id()), headers=h)
        assert _flows(await _samples(app)) == {**zero, "STARTED": 1.0, "SUSPENDED": 1.0, "PREPARED": 1.0}
        await app.client.post(f"{FLOWS}/{first}/terminate", headers=h)
        await app.client.post(f"{FLOWS}/{second}/completed", json={}, headers=h)
        assert _flows(await _samples(app)) == {**zero, "PREPARED": 1.0, "TERMINATED": 1.0, "COMPLETED": 1.0}


async def test_two_signaling_apps_in_one_process_have_their_own_metrics(
    base_settings: dict[str, Any], cp_token: Any
) -> None:
    """Each app counts on a registry of its own (nothing process-global): a signal to one app is
    seen in its registry and its /metrics, not in the other's; the readiness gauge is per app too."""
    started = {"signal": "start", "outcome": "ok"}
    async with run_app(base_settings) as one, run_app(base_settings) as other:
        assert one.metrics.registry is not other.metrics.registry
        message = start_message(new_id())
        answer = await one.client.post(f"{FLOWS}/start", json=message, headers=auth(cp_token()))
        assert answer.status_code == 200, answer.text
        assert one.metrics.registry.get_sample_value("signaling_signals_total", started) == 1
        assert other.metrics.registry.get_sample_value("signaling_signals_total", started) is None
        assert one.metrics.registry.get_sample_value("signaling_pull_tokens_issued_total") == 1
        assert other.metrics.registry.get_sample_value("signaling_pull_tokens_issued_total") == 0
        assert sample(await scrape(one.client), "signaling_signals_total", **started) == 1
        assert sample(await scrape(other.client), "signaling_signals_total", **started) == 0
        # the dependency gauge sits on each app's registry: only the probed app reports it
        assert (await other.client.get("/readyz")).status_code == 200
        up = {"dependency": "database", "required": "true"}
        assert other.metrics.registry.get_sample_value("readiness_dependency_up", up) == 1
        assert one.metrics.registry.get_sample_value("readiness_dependency_up", up) is None
