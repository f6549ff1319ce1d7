"""Prometheus metrics of the gateway, on a registry per app (served by its /metrics), so two apps
in one process never count into each other. Nothing is registered at import: `create_app` makes
one `Metrics` and hands it to what counts. Labels are route templates, statuses, codes, tiers and hop names
— never a caller, key or token (RF-08)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from dataplane_service_kit.health import app_registry
from dataplane_service_kit.http_metrics import (
    BUCKETS,
    DURATION_HELP,
    DURATION_LABELS,
    REQUESTS_HELP,
    REQUESTS_LABELS,
)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else app_registry()
        r = self.registry
        # every HTTP answer and its duration, by route template and status, both recorded by the
        # front door (dataplane_service_kit.front_door)
        self.requests = Counter("query_gateway_requests_total", REQUESTS_HELP, REQUESTS_LABELS, registry=r)
        self.plan_replies_read = Counter(
            "query_gateway_plan_replies_total",
            "Plan replies that answered a request, by the copy that came first: redis (the early copy "
            "on this instance's channel) or kafka",
            ["via"],
            registry=r,
        )
        self.plan_cache = Counter(
            "query_gateway_plan_cache_total", "Plan lookups by tier result", ["result"], registry=r
        )
        self.disclosures = Counter(
            "query_gateway_disclosures_published_total", "Disclosure events acknowledged", registry=r
        )
        self.ds_decision_cache_hits = Counter(
            "query_gateway_ds_decision_cache_hits_total",
            "ds decisions served from this replica's cache",
            registry=r,
        )
        self.ds_decision_cache_misses = Counter(
            "query_gateway_ds_decision_cache_misses_total",
            "ds decision cache lookups that found no live entry",
            registry=r,
        )
        self.request_duration = Histogram(
            "query_gateway_request_duration_seconds",
            DURATION_HELP,
            DURATION_LABELS,
            buckets=BUCKETS,
            registry=r,
        )
        # where a miss's time goes on this side (issue 12); labels are hop names only
        self.miss_hops = Histogram(
            "query_gateway_plan_miss_hop_seconds",
            "Hops of a plan-cache miss: claim (store the claim check), request (publish the "
            "PlanRequest), reply (request published → its reply read), reply_fetch (reply produced → "
            "read here), plan_read (the resolved plan out of Redis)",
            ["hop"],
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=r,
        )
        self.catalogue_info = Gauge(
            "query_gateway_catalogue_info",
            "1 for the catalogue file being served, by the first 12 hex digits of its SHA-256",
            ["digest"],
            registry=r,
        )
        self.catalogue_reloads = Counter(
            "query_gateway_catalogue_reloads_total",
            "Catalogue reloads (SIGHUP) by outcome",
            ["outcome"],
            registry=r,
        )
        # QE-10: statements whose total across replicas could not be counted in Redis (the
        # replica's own share still bounded them)
        self.share_uncounted = Counter(
            "query_gateway_consumer_share_uncounted_total",
            "Statements run without the per-consumer total across replicas (Redis unavailable)",
            registry=r,
        )
        self.plan_cost_per_ms = Gauge(
            "query_gateway_plan_cost_per_ms",
            "PostgreSQL cost units per millisecond measured at start-up (QE-06's calibration; 0 before it)",
            registry=r,
        )
