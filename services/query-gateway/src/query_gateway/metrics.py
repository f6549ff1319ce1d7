"""Prometheus metrics of the gateway (default registry, served by /metrics)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from dataplane_service_kit.request_durations import BUCKETS, DURATION_HELP, DURATION_LABELS

REQUESTS = Counter(
    "query_gateway_requests_total",
    "Query requests by path, status and error code",
    ["path", "status", "code"],
)
PLAN_REPLIES_READ = Counter(
    "query_gateway_plan_replies_total",
    "Plan replies that answered a request, by the copy that came first: redis (the early copy on "
    "this instance's channel) or kafka",
    ["via"],
)
PLAN_CACHE = Counter("query_gateway_plan_cache_total", "Plan lookups by tier result", ["result"])
DISCLOSURES = Counter("query_gateway_disclosures_published_total", "Disclosure events acknowledged")
DS_DECISION_CACHE_HITS = Counter(
    "query_gateway_ds_decision_cache_hits_total", "ds decisions served from this replica's cache"
)
DS_DECISION_CACHE_MISSES = Counter(
    "query_gateway_ds_decision_cache_misses_total", "ds decision cache lookups that found no live entry"
)
# every HTTP request by route and status (the query routes observed by their plain door, the rest
# by the framework's RequestDurations layer)
REQUEST_DURATION = Histogram(
    "query_gateway_request_duration_seconds", DURATION_HELP, DURATION_LABELS, buckets=BUCKETS
)
