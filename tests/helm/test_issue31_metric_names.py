"""Issue 31 (one metric vocabulary): every series the chart's Grafana dashboard and PrometheusRule
name is one a service's own registry exposes — the four services' registries built as their apps
build them, not their sources read — every HTTP family is labelled by `route` (never `path`), and
every service exports the process figures (`process_*`). The PromQL is read here with a small
scanner of our own (metric names are the identifiers that are neither a function, a keyword, a
label nor inside a string), so this holds on a machine without node as well."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from dataplane_service_kit.health import health_router
from dataplane_testing.scripts import load_script

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm"
chart = load_script("deploy/helm/render.py", "dataplane_chart_render_issue31")

PROCESS = (
    "process_cpu_seconds_total",
    "process_resident_memory_bytes",
    "process_open_fds",
    "process_start_time_seconds",
)
_KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring"})
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_LABEL_VALUES = re.compile(r"label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:,[^)]*)?\)")
_IDENTIFIER = re.compile(r"(?<![\w:.$])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w:])(?!\s*\()")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression (or a Grafana `label_values` query) selects."""
    text = _LABEL_VALUES.sub(r"\1", expr)
    text = _MATCHERS.sub("", _STRING.sub('""', text))
    text = _GROUPING.sub("", _RANGE.sub("", text))
    return {name for name in _IDENTIFIER.findall(text) if name not in _KEYWORDS}


def _registries() -> dict[str, CollectorRegistry]:
    """Each service's registry as its app builds it: its metrics, and what its health router
    registers there (the readiness gauge)."""
    from audit_relay.metrics import Metrics as RelayMetrics
    from filter_resolver.metrics import Metrics as ResolverMetrics
    from query_gateway.metrics import Metrics as GatewayMetrics
    from signaling.metrics import Metrics as SignalingMetrics

    registries = {
        "query-gateway": GatewayMetrics().registry,
        "signaling": SignalingMetrics().registry,
        "filter-resolver": ResolverMetrics().registry,
        "audit-relay": RelayMetrics().registry,
    }
    for registry in registries.values():
        health_router(dict, registry=registry)
    return registries


def exposed(registry: CollectorRegistry) -> set[str]:
    """The series names the registry exposes: each family's, as the text format writes them."""
    names: set[str] = set()
    for family in registry.collect():
        names |= {s.name for s in family.samples}
        if family.type == "counter":
            names.add(family.name + "_total")
        elif family.type == "histogram":
            names |= {f"{family.name}_bucket", f"{family.name}_sum", f"{family.name}_count"}
        else:
            names.add(family.name)
    return names


def _expressions() -> Iterator[str]:
    objects = chart.render_objects(chart.load_values(CHART / "ci" / "cluster-fit.yaml"))
    (rule,) = [o for o in objects if o["kind"] == "PrometheusRule"]
    for group in rule["spec"]["groups"]:
        for r in group["rules"]:
            yield r["expr"]
    (cm,) = [o for o in objects if o["kind"] == "ConfigMap" and "dataplane.json" in o.get("data", {})]
    dashboard: dict[str, Any] = json.loads(cm["data"]["dataplane.json"])
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            yield target["expr"]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            yield query["query"]


def test_issue31_the_scanner_reads_metric_names_only() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, route) (rate(a_seconds_bucket{namespace=~"$namespace", '
        'route="/q"}[5m]))) > 1.5 and on (job) sum(b_total offset 5m) / ignoring (x) c unless d'
    )
    assert metric_names(expr) == {"a_seconds_bucket", "b_total", "c", "d"}
    assert metric_names("label_values(query_gateway_requests_total, namespace)") == {
        "query_gateway_requests_total"
    }


_PATH_LABEL = re.compile(r"\bpath\s*(?:=|!=|=~|!~)|[(,]\s*path\s*[,)]")


def test_issue31_every_series_the_dashboard_and_the_alerts_name_is_exported() -> None:
    expressions = list(_expressions())
    named = set().union(*map(metric_names, expressions))
    assert len(named) >= 15
    exported = set().union(*map(exposed, _registries().values()))
    assert named - exported == set()
    # the HTTP families are read by their route template: no expression selects or groups by path
    assert [e for e in expressions if _PATH_LABEL.search(e)] == []


@pytest.mark.parametrize("service", ["query-gateway", "signaling", "filter-resolver", "audit-relay"])
def test_issue31_every_service_exports_the_process_figures(service: str) -> None:
    samples = {s.name for family in _registries()[service].collect() for s in family.samples}
    assert set(PROCESS) <= samples, service


@pytest.mark.parametrize("service", ["query_gateway", "signaling"])
def test_issue31_every_http_family_is_labelled_by_route(service: str) -> None:
    """The door records both families under one label set; a family labelled otherwise (say
    `path`) refuses these labels."""
    from query_gateway.metrics import Metrics as GatewayMetrics
    from signaling.metrics import Metrics as SignalingMetrics

    metrics = GatewayMetrics() if service == "query_gateway" else SignalingMetrics()
    metrics.requests.labels(route="/x/{id}", status="200", code="").inc()
    metrics.request_duration.labels(route="/x/{id}", status="200").observe(0.01)
    names = (f"{service}_requests", f"{service}_request_duration_seconds")
    http = [f for f in metrics.registry.collect() if f.name in names]
    assert len(http) == 2
    for family in http:
        assert all("route" in s.labels and "path" not in s.labels for s in family.samples), family.name
