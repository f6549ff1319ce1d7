"""`filter-resolver`: settings, logging, telemetry, then the app."""

from __future__ import annotations

import sys

from dataplane_service_kit.logs import configure_logging
from dataplane_service_kit.serve import serve
from dataplane_service_kit.settings import load_settings
from dataplane_service_kit.telemetry import setup_telemetry
from filter_resolver.app import create_app
from filter_resolver.handlers.plugins import PluginLoadError
from filter_resolver.settings import Settings


def main() -> None:
    settings = load_settings(Settings)
    # httpx and httpcore quiet: an http_in_list URL may carry a caller's values (QUIET_LIBRARIES)
    configure_logging("filter-resolver", settings.log_level)
    setup_telemetry("filter-resolver")
    try:
        app = create_app(settings)
    except PluginLoadError as exc:
        print(f"invalid configuration: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    serve(app, settings)


if __name__ == "__main__":
    main()
