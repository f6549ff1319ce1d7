"""Prometheus metrics of the relay, in a registry of their own so an app built twice in one
process (tests) does not register a metric twice."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
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
        self.delivery_latency = Histogram(
            "audit_relay_delivery_latency_seconds",
            "From the record's broker timestamp to ds accepting it.",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600),
            registry=self.registry,
        )
        self.consumer_lag = Gauge(
            "audit_relay_consumer_lag",
            "Records on the partition not yet committed by this group.",
            ["topic", "partition"],
            registry=self.registry,
        )
