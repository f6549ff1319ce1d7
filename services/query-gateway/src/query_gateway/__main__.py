"""`query-gateway`: settings, logging, telemetry, then serve."""

from __future__ import annotations

from query_gateway.catalogue.early_signals import remember_early_reloads


def main() -> None:
    # first, before the imports below take their second: a SIGHUP during start-up must not end it
    remember_early_reloads()
    from dataplane_service_kit.logs import configure_logging
    from dataplane_service_kit.serve import serve
    from dataplane_service_kit.settings import load_settings
    from dataplane_service_kit.telemetry import setup_telemetry
    from query_gateway.app import create_app
    from query_gateway.settings import Settings

    settings = load_settings(Settings)
    configure_logging("query-gateway", settings.log_level)  # httpx quiet (QUIET_LIBRARIES)
    setup_telemetry("query-gateway")
    serve(create_app(settings), settings)


if __name__ == "__main__":
    main()
