"""The tests' support package: importable from every test and conftest as `dataplane_testing`
(the root pyproject puts `tests/` on pytest's `pythonpath`; mypy checks it like the services).

Shared by every folder: `polling` (waiting on a condition, the limit scaled by
DATAPLANE_TEST_TIMEOUT_FACTOR), `processes` (a service run as a real process), `topics` (creating
and reading Kafka topics), `metrics` (reading Prometheus text), `databases` (a test's own
databases on the session's PostgreSQL), `openapi` (Schemathesis over a served document) and
`scripts` (the repository's scripts that are not in a package, loaded by path). One module per
part for what only its tests need: `resolver`, `audit_relay`, `signaling`, `gateway`, `records`,
`faults`, `sqlgw`, `exposure` and `e2e`."""
