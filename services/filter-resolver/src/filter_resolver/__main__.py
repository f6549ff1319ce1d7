"""`filter-resolver`: settings, logging, telemetry, then the app."""

from __future__ import annotations

import logging
import sys

from dataplane_service_kit.logs import configure_logging
from dataplane_service_kit.serve import serve
from dataplane_service_kit.settings import load_settings
from dataplane_service_kit.telemetry import setup_telemetry
from filter_resolver.app import create_app
from filter_resolver.handlers.plugins import PluginLoadError
from filter_resolver.settings import Settings

# their request lines carry URLs, and an http_in_list URL may carry a caller's values (RF-08)
_QUIET = ("httpx", "httpcore")


def main() -> None:
    settings = load_settings(Settings)
    configure_logging("filter-resolver", settings.log_level)
    for name in _QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)
    setup_telemetry("filter-resolver")
    try:
        app = create_app(settings)
    except PluginLoadError as exc:
        print(f"invalid configuration: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    serve(app, settings)


if __name__ == "__main__":
    main()
