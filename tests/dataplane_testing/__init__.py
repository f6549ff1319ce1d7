"""The tests' support package: importable from every test and conftest as `dataplane_testing`
(the root pyproject puts `tests/` on pytest's `pythonpath`).

Shared by every folder: `polling` (waiting on a condition, scaled by
DATAPLANE_TEST_TIMEOUT_FACTOR), `processes` (a service run as a real process), `topics` (reading
and creating Kafka topics), `metrics` (reading Prometheus text) and `openapi` (Schemathesis over a
served document). One module per part for what only its tests need: `resolver`, `audit_relay`,
`signaling`, `gateway`, `records`, `faults`, `sqlgw`, `exposure` and `e2e`."""
