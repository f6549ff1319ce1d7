"""The gateway's metrics live on a registry per app: importing the gateway registers nothing in
prometheus_client's global registry, and two apps in one process count apart."""

from __future__ import annotations

import importlib
import pkgutil

from prometheus_client import REGISTRY

import query_gateway
from query_gateway.clients.decision_cache import DsDecisionCache
from query_gateway.metrics import Metrics


def test_importing_every_gateway_module_registers_nothing_globally() -> None:
    for module in pkgutil.walk_packages(query_gateway.__path__, "query_gateway."):
        importlib.import_module(module.name)
    names = {metric.name for metric in REGISTRY.collect()}
    assert not {n for n in names if n.startswith("query_gateway_")}, names


def test_two_gateway_apps_in_one_process_have_their_own_metrics() -> None:
    one, other = Metrics(), Metrics()
    DsDecisionCache(4, metrics=one).get(("https://ds", "did:web:c", "agr", None, (), ("d",)))
    misses = "query_gateway_ds_decision_cache_misses_total"
    assert one.registry.get_sample_value(misses) == 1.0
    assert other.registry.get_sample_value(misses) == 0.0
    # each serves the process's own figures beside its own, as the global registry did
    assert one.registry.get_sample_value("process_cpu_seconds_total") is not None
