"""Prometheus metrics of the relay, in a registry of their own so an app built twice in one
process (tests) does not register a metric twice."""

from __future__ import annotations

from typing import Literal

from prometheus_client import Counter, Gauge, Histogram

from dataplane_service_kit.health import app_registry

Outcome = Literal["delivered", "retried", "dead_lettered"]


class Metrics:
    def __init__(self) -> None:
        # with process_* and python_* beside the relay's own (the service kit's app registry)
        self.registry = app_registry()
        self.delivered = Counter(
            "audit_relay_delivered", "Disclosures ds accepted (2xx).", registry=self.registry
        )
        self.retried = Counter(
            "audit_relay_retried",
            "Delivery attempts that will be retried, by cause.",
            ["cause"],
            registry=self.registry,
        )
        self.dead_lettered = Counter(
            "audit_relay_dead_lettered",
            "Disclosures written to the dead-letter topic, by reason.",
            ["reason"],
            registry=self.registry,
        )
        # the three above in one family, for a dashboard that wants every outcome in one query;
        # the older counters stay, under their names, for what already reads them
        self.deliveries = Counter(
            "audit_relay_deliveries",
            "Outcomes of handling a record: delivered (ds 2xx), retried (a failed attempt that "
            "will be repeated), dead_lettered (the DLQ holds it).",
            ["outcome"],
            registry=self.registry,
        )
        self.delivery_latency = Histogram(
            "audit_relay_delivery_latency_seconds",
            "From the record's broker timestamp to ds accepting it.",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600),
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "audit_relay_in_flight",
            "Posts to ds sent and not yet answered.",
            registry=self.registry,
        )
        self.buffered = Gauge(
            "audit_relay_buffered_records",
            "Records fetched and not yet delivered or dead-lettered (bounded per partition by "
            "AUDIT_RELAY_MAX_BUFFERED_PER_PARTITION).",
            registry=self.registry,
        )
        self.consumer_lag = Gauge(
            "audit_relay_consumer_lag",
            "Records on the partition not yet committed by this group.",
            ["topic", "partition"],
            registry=self.registry,
        )
        self.offset_gaps = Counter(
            "audit_relay_offset_gaps",
            "Commits refused because an offset between the last commit and the new one was "
            "neither delivered, dead-lettered nor a hole the broker kept showing; the partition "
            "was fetched again from the last commit (RF-10: never skip one). 0 unless the relay "
            "has a fault.",
            registry=self.registry,
        )
        self.fetch_jumps = Counter(
            "audit_relay_fetch_jumps",
            "Fetches that jumped past a record the broker showed a moment later; the relay fetched "
            "again from the missing offset instead of taking the jump (a broker's reordering).",
            registry=self.registry,
        )
        for outcome in ("delivered", "retried", "dead_lettered"):
            self.deliveries.labels(outcome)  # every outcome shows, at 0, from the first scrape

    def outcome(self, outcome: Outcome) -> None:
        self.deliveries.labels(outcome).inc()
