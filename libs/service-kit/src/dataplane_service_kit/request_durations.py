"""Request durations in seconds by route template and status (docs/operations.md, "Metrics"):
`<service>_request_duration_seconds{route, status}`, a histogram the dashboard reads latency
percentiles and request rates from. Probes and the scrape are not counted; a request that no
route matched is counted under `unmatched`, never under its raw path (a path can carry an id)."""

from __future__ import annotations

import time

from prometheus_client import Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# from half a millisecond (a warm answer) to the longest bound a request may take
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
NOT_TIMED = frozenset({"/healthz", "/readyz", "/metrics"})
UNMATCHED = "unmatched"


# each service declares `<service>_request_duration_seconds` with these (a literal name per
# service, so the chart's tests find every metric it reads in the sources)
DURATION_HELP = "HTTP requests by route template and status: time from the request to the answer's end"
DURATION_LABELS = ("route", "status")


class RequestDurations:
    """Plain ASGI: each HTTP request's duration, labelled by the route the framework matched."""

    def __init__(self, app: ASGIApp, histogram: Histogram) -> None:
        self.app = app
        self._histogram = histogram

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in NOT_TIMED:
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # an app that fails before answering: the server answers 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = getattr(scope.get("route"), "path", None)
            label = route if isinstance(route, str) else UNMATCHED
            self._histogram.labels(label, str(status)).observe(time.perf_counter() - started)
