"""`signaling` serves; `signaling public-key` prints the public PEM of DPS_TOKEN_SIGNING_KEY
(what the gateway's DPS_TOKEN_PUBLIC_KEY must be), so operators derive it instead of copying;
`signaling register` sends this data plane's registration to an EDC control plane
(`signaling/register.py`)."""

from __future__ import annotations

import os
import sys

from dataplane_service_kit.logs import configure_logging
from dataplane_service_kit.serve import serve
from dataplane_service_kit.settings import load_settings
from dataplane_service_kit.telemetry import setup_telemetry
from signaling.settings import Settings, load_signing_key
from signaling.tokens import public_key_pem

USAGE = "usage: signaling [serve | public-key | register]"


def print_public_key() -> None:
    pem = os.environ.get("DPS_TOKEN_SIGNING_KEY")
    if not pem:
        print("invalid configuration: DPS_TOKEN_SIGNING_KEY: required", file=sys.stderr)
        raise SystemExit(2)
    try:
        key = load_signing_key(pem)
    except ValueError as exc:
        print(f"invalid configuration: DPS_TOKEN_SIGNING_KEY: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    sys.stdout.write(public_key_pem(key))


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    command = args[0] if args else "serve"
    if command == "public-key":
        print_public_key()
        return
    if command == "register":
        from signaling.register import main as register

        register()
        return
    if command != "serve":
        print(USAGE, file=sys.stderr)
        raise SystemExit(2)
    settings = load_settings(Settings)
    configure_logging("signaling", settings.log_level)
    setup_telemetry("signaling")
    from signaling.app import create_app

    serve(create_app(settings), settings)


if __name__ == "__main__":
    main()
