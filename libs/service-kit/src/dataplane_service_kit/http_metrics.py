"""The HTTP metrics every service's front door records (docs/operations.md, "Metrics"), one label
set for both: `<service>_request_duration_seconds{route, status}`, a histogram the dashboard reads
latency percentiles from, and `<service>_requests_total{route, status, code}`, every answer with
its error code (`""` for a success). `route` is the route template with its full path
(`/dps/v1/dataflows/{flow_id}/start`), `unmatched` when no route matched — never the raw path, which
would let a caller make series without bound (a path can carry an id). Probes and the scrape are
not counted."""

from __future__ import annotations

# from half a millisecond (a warm answer) to the longest bound a request may take
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
NOT_TIMED = frozenset({"/healthz", "/readyz", "/metrics"})
UNMATCHED = "unmatched"
# a problem document whose `error` is no code of ours (nothing of ours answers so; a bound all the same)
OTHER_CODE = "other"

# each service declares its two families with these (a literal name per service, so the chart's
# tests find every metric it reads in the sources)
DURATION_HELP = "HTTP requests by route template and status: time from the request to the answer's end"
DURATION_LABELS = ("route", "status")
REQUESTS_HELP = "HTTP answers by route template, status and error code (empty for a success)"
REQUESTS_LABELS = ("route", "status", "code")
