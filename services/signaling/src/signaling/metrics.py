"""Prometheus metrics (process-global, as prometheus_client's registry is)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

FLOWS = Gauge("signaling_flows", "Data flows in the database by state", ["state"])
SIGNALS = Counter("signaling_signals_total", "Signals received by signal and outcome", ["signal", "outcome"])
TOKENS_ISSUED = Counter("signaling_pull_tokens_issued_total", "Pull tokens issued")
TOKENS_RETIRED = Counter("signaling_pull_tokens_retired_total", "Pull tokens retired")
EVENTS_PUBLISHED = Counter("signaling_flow_events_published_total", "Outbox rows published to Kafka")
