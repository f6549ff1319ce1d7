"""Prometheus metrics, on a registry per app so two apps in one process (tests) never collide.

Nothing is registered at import: `create_app` makes one `Metrics` and hands it to what counts."""

from __future__ import annotations

import asyncio
import time

from prometheus_client import Counter, Gauge, Histogram
from sqlalchemy.ext.asyncio import AsyncEngine

from dataplane_contracts.dps import FlowState
from dataplane_service_kit.health import app_registry
from dataplane_service_kit.http_metrics import (
    BUCKETS,
    DURATION_HELP,
    DURATION_LABELS,
    REQUESTS_HELP,
    REQUESTS_LABELS,
)
from dataplane_service_kit.logs import get_logger
from signaling import repository

log = get_logger(__name__)


class Metrics:
    def __init__(self) -> None:
        self.registry = app_registry()
        # every HTTP answer and its duration, recorded by the front door (dataplane_service_kit.front_door)
        self.requests = Counter(
            "signaling_requests_total", REQUESTS_HELP, REQUESTS_LABELS, registry=self.registry
        )
        self.request_duration = Histogram(
            "signaling_request_duration_seconds",
            DURATION_HELP,
            DURATION_LABELS,
            buckets=BUCKETS,
            registry=self.registry,
        )
        self.flows = Gauge(
            "signaling_flows", "Data flows in the database by state", ["state"], registry=self.registry
        )
        self.signals = Counter(
            "signaling_signals_total",
            "Signals received by signal and outcome",
            ["signal", "outcome"],
            registry=self.registry,
        )
        self.tokens_issued = Counter(
            "signaling_pull_tokens_issued_total", "Pull tokens issued", registry=self.registry
        )
        self.tokens_retired = Counter(
            "signaling_pull_tokens_retired_total", "Pull tokens retired", registry=self.registry
        )
        self.callbacks = Counter(
            "signaling_callbacks_total",
            "DPS-12 callback attempts of asynchronous signals by action and outcome (delivered, failed, "
            "dropped)",
            ["action", "outcome"],
            registry=self.registry,
        )
        self.events_published = Counter(
            "signaling_flow_events_published_total", "Outbox rows published to Kafka", registry=self.registry
        )


class FlowGauge:
    """Recounts `signaling_flows{state}` from the database when /metrics is scraped.

    The gauge counts the whole database, not this process's transitions (every replica changes
    it), so it is recounted rather than incremented; on scrape, because that is when it is read
    and it then holds with or without an outbox relay in this process. `min_interval_s` > 0 lets
    a large flows table be recounted at most that often (several scrapers)."""

    def __init__(
        self, engine: AsyncEngine, metrics: Metrics, min_interval_s: float = 0.0, timeout_s: float = 2.0
    ) -> None:
        self._engine = engine
        self._gauge = metrics.flows
        self._min_interval = min_interval_s
        self._timeout = timeout_s
        self._counted_at: float | None = None

    async def refresh(self) -> None:
        now = time.monotonic()
        if self._counted_at is not None and now - self._counted_at < self._min_interval:
            return
        try:
            async with asyncio.timeout(self._timeout), self._engine.connect() as conn:
                counts = await repository.flows_by_state(conn)
        except Exception as exc:  # the scrape still answers (last counts); /readyz reports the database
            log.warning("flow_gauge_recount_failed", error=type(exc).__name__)
            return
        self._counted_at = now
        for state in FlowState:  # states with no flow left must read 0, not their last count
            self._gauge.labels(state=state.value).set(counts.get(state.value, 0))
