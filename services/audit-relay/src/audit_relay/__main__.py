"""`audit-relay`: settings, logging, telemetry, then the HTTP app whose lifespan runs the consumer."""

from __future__ import annotations

from audit_relay.app import create_app
from audit_relay.settings import Settings
from dataplane_service_kit.logs import configure_logging
from dataplane_service_kit.serve import serve
from dataplane_service_kit.settings import load_settings
from dataplane_service_kit.telemetry import setup_telemetry


def main() -> None:
    settings = load_settings(Settings)
    configure_logging("audit-relay", settings.log_level)  # httpx quiet (QUIET_LIBRARIES)
    setup_telemetry("audit-relay")
    serve(create_app(settings), settings)


if __name__ == "__main__":
    main()
