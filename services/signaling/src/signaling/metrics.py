"""Prometheus metrics (process-global, as prometheus_client's registry is)."""

from __future__ import annotations

import asyncio
import time

from prometheus_client import Counter, Gauge, Histogram
from sqlalchemy.ext.asyncio import AsyncEngine

from dataplane_contracts.dps import FlowState
from dataplane_service_kit.logs import get_logger
from dataplane_service_kit.request_durations import BUCKETS, DURATION_HELP, DURATION_LABELS
from signaling import repository

log = get_logger(__name__)

REQUEST_DURATION = Histogram(
    "signaling_request_duration_seconds", DURATION_HELP, DURATION_LABELS, buckets=BUCKETS
)
FLOWS = Gauge("signaling_flows", "Data flows in the database by state", ["state"])
SIGNALS = Counter("signaling_signals_total", "Signals received by signal and outcome", ["signal", "outcome"])
TOKENS_ISSUED = Counter("signaling_pull_tokens_issued_total", "Pull tokens issued")
TOKENS_RETIRED = Counter("signaling_pull_tokens_retired_total", "Pull tokens retired")
CALLBACKS = Counter(
    "signaling_callbacks_total",
    "DPS-12 callback attempts of asynchronous signals by action and outcome (delivered, failed, dropped)",
    ["action", "outcome"],
)
EVENTS_PUBLISHED = Counter("signaling_flow_events_published_total", "Outbox rows published to Kafka")


class FlowGauge:
    """Recounts `signaling_flows{state}` from the database when /metrics is scraped.

    The gauge counts the whole database, not this process's transitions (every replica changes
    it), so it is recounted rather than incremented; on scrape, because that is when it is read
    and it then holds with or without an outbox relay in this process. `min_interval_s` > 0 lets
    a large flows table be recounted at most that often (several scrapers)."""

    def __init__(self, engine: AsyncEngine, min_interval_s: float = 0.0, timeout_s: float = 2.0) -> None:
        self._engine = engine
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
            FLOWS.labels(state=state.value).set(counts.get(state.value, 0))
