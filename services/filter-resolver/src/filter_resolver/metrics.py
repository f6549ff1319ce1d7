"""Prometheus metrics, on a registry per app so two apps in one process never collide.

Labels are handler names, outcomes, error codes and plan kinds — never a caller, principal, key,
token or cache key (RF-08)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from dataplane_service_kit.health import app_registry


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        # with process_* and python_* beside the resolver's own (the service kit's app registry)
        self.registry = registry if registry is not None else app_registry()
        self.resolutions = Counter(
            "filter_resolver_resolutions",
            "Plan requests answered, by handler, outcome (cached|one_shot|error), error code and plan kind",
            ["handler", "outcome", "error_code", "plan"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "filter_resolver_resolution_seconds",
            "Time from taking the claim check to publishing the reply, by handler",
            ["handler"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20),
            registry=self.registry,
        )
        self.cache_writes = Counter(
            "filter_resolver_cache_writes",
            "Plans written to Redis, by key kind (plan|one_shot)",
            ["kind"],
            registry=self.registry,
        )
        self.retries = Counter(
            "filter_resolver_upstream_retries",
            "Transient upstream failures retried, by handler",
            ["handler"],
            registry=self.registry,
        )
        self.coalesced = Counter(
            "filter_resolver_coalesced",
            "Requests answered by a resolution already in flight for the same cache key",
            registry=self.registry,
        )
        # where a request's time goes, hop by hop (issue 12): the labels are hop names only
        self.hops = Histogram(
            "filter_resolver_hop_seconds",
            "Time of each hop of a plan request: fetch (produced → handed to the resolver), claim "
            "(take the claim check), resolve (the handler), store (the plan into Redis), reply "
            "(publish the reply), notify (the early copy on the asker's Redis channel), commit (the offsets, "
            "after the replies)",
            ["hop"],
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=self.registry,
        )
        self.assigned_partitions = Gauge(
            "filter_resolver_assigned_partitions",
            "Partitions of the plan-request topic this member holds",
            registry=self.registry,
        )
