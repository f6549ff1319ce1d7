"""What the chart gives an SRE to look at (issue 14): the Grafana dashboard and the PrometheusRule
select only metrics the services export — every PromQL expression parsed with Prometheus's grammar
(deploy/helm/validate/validate-promql.mjs), every metric it names found among the services'
Counter/Gauge/Histogram declarations — the dashboard shows what operators asked for, and every
alert is explained in docs/operations.md."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from dataplane_testing.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm"
SOURCES = [*(ROOT / "services").glob("*/src"), ROOT / "libs" / "service-kit" / "src"]

chart = load_script("deploy/helm/render.py", "dataplane_chart_render_mon")

_DECLARED = re.compile(r"\b(Counter|Gauge|Histogram|Summary)\(\s*\"([a-zA-Z_:][a-zA-Z0-9_:]*)\"")


def series_of(kind: str, name: str) -> set[str]:
    """The series names prometheus_client exposes for one declared metric."""
    if kind == "Counter":
        return {name.removesuffix("_total") + "_total"}
    if kind == "Histogram":
        return {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    if kind == "Summary":
        return {name, f"{name}_sum", f"{name}_count"}
    return {name}


def exported_series() -> set[str]:
    found: set[str] = set()
    for src in SOURCES:
        for path in src.rglob("*.py"):
            for kind, name in _DECLARED.findall(path.read_text()):
                found |= series_of(kind, name)
    return found


def promql_metrics(node_modules: Path, *files: Path) -> dict[str, Any]:
    run = subprocess.run(
        ["node", str(node_modules / "validate-promql.mjs"), *map(str, files)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    result: dict[str, Any] = json.loads(run.stdout)
    return result


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    values = chart.load_values(CHART / "ci" / "cluster-fit.yaml")
    out = tmp_path_factory.mktemp("monitoring") / "rendered.yaml"
    out.write_text(chart.render(values))
    return out


def _objects(path: Path) -> list[dict[str, Any]]:
    return [o for o in yaml.safe_load_all(path.read_text()) if o]


def test_the_sources_scan_finds_what_operations_documents() -> None:
    """The scan is the ground truth below, so it must see the services' real metrics."""
    series = exported_series()
    for name in (
        "query_gateway_requests_total",
        "audit_relay_deliveries_total",
        "audit_relay_delivery_latency_seconds_bucket",
        "signaling_flows",
        "readiness_dependency_up",
        "filter_resolver_resolutions_total",
    ):
        assert name in series
    assert "audit_relay_deliveries" not in series  # a counter is exposed with _total only


def test_every_metric_in_the_dashboard_and_the_alerts_is_exported(node_modules: Path, rendered: Path) -> None:
    used = promql_metrics(node_modules, rendered)
    assert used["expressions"] >= 30
    unknown = set(used["metrics"]) - exported_series()
    assert unknown == set()


def test_an_unexported_metric_or_a_syntax_error_is_caught(node_modules: Path, tmp_path: Path) -> None:
    rule = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "r"},
        "spec": {
            "groups": [
                {"name": "g", "rules": [{"alert": "A", "expr": "rate(query_gateway_requestz_total[5m]) > 0"}]}
            ]
        },
    }
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(rule))
    used = promql_metrics(node_modules, good)
    assert set(used["metrics"]) - exported_series() == {"query_gateway_requestz_total"}

    rule["spec"]["groups"][0]["rules"][0]["expr"] = "sum(rate(x[5m]) > "
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(rule))
    run = subprocess.run(
        ["node", str(node_modules / "validate-promql.mjs"), str(bad)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert run.returncode == 1
    assert "PromQL syntax error" in run.stderr


def test_the_dashboard_shows_what_operators_need(rendered: Path) -> None:
    (cm,) = [
        o for o in _objects(rendered) if o["kind"] == "ConfigMap" and "dataplane.json" in o.get("data", {})
    ]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(cm["data"]["dataplane.json"])
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    text = "\n".join(exprs)
    # request rate, errors by code, latency p50/p99 per route (both HTTP services)
    assert "sum by (route) (rate(query_gateway_requests_total" in text
    assert "sum by (code, status)" in text
    for histogram in ("query_gateway_request_duration_seconds", "signaling_request_duration_seconds"):
        for q in ("0.5", "0.99"):
            assert f"histogram_quantile({q}, sum by (le, route) (rate({histogram}_bucket" in text
    # plan-cache and decision-cache hit ratios
    assert 'query_gateway_plan_cache_total{namespace=~"$namespace", result="hit"}' in text
    assert "query_gateway_ds_decision_cache_hits_total" in text
    # relay lag and delivery rate
    assert "audit_relay_consumer_lag" in text and "audit_relay_deliveries_total" in text
    # revocation checks: pulls refused for a flow no longer started or a token no longer live
    assert "flow_not_started|pull_token" in text


def test_every_alert_is_explained_in_operations(rendered: Path) -> None:
    (rule,) = [o for o in _objects(rendered) if o["kind"] == "PrometheusRule"]
    alerts = [r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]]
    assert len(alerts) == len(set(alerts)) >= 10
    operations = (ROOT / "docs" / "operations.md").read_text()
    assert [a for a in alerts if f"`{a}`" not in operations] == []
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    # the thresholds are values
    exprs = {r["alert"]: r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert exprs["DataplaneAuditRelayLagging"].endswith("> 5000")
    assert "> 1.5" in exprs["DataplaneGatewayLatencyHigh"]
    assert exprs["DataplaneResolverPartitionsUnassigned"].endswith("< 6")


def test_nothing_is_rendered_unless_asked() -> None:
    kinds = [(o["kind"], o["metadata"]["name"]) for o in chart.render_objects({})]
    assert ("PrometheusRule", "dataplane") not in kinds
    assert ("ConfigMap", "dataplane-dashboard") not in kinds
