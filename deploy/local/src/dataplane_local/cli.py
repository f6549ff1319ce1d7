"""`dataplane-local up | down | status | restart NAME | reload NAME | demo | traces`: the
one-command local system (no Docker)."""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

from dataplane_local.stack import Stack, missing_services


def _demo(root: Path | None) -> int:
    from dataplane_local import demo, stack

    missing = missing_services()
    if missing:
        print("the demo needs all four services; not available yet:")
        for name, why in missing.items():
            print(f"  {name}: {why}")
        return 2
    return demo.main((root or stack.default_root()).resolve())


def main(argv: list[str] | None = None) -> int:
    # the embedded servers' packages ask platformdirs for a runtime directory, which warns where
    # XDG_RUNTIME_DIR is unset (a container, CI) and falls back to /tmp: said on every `up`, to no use
    warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
    parser = argparse.ArgumentParser(
        prog="dataplane-local",
        description="Run the data plane locally: infrastructure, development doubles, the four services.",
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="state directory (default: $DATAPLANE_LOCAL_DIR or <workspace>/.local)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start everything and wait until ready")
    up.add_argument("--infra-only", action="store_true", help="infrastructure and doubles only")
    up.add_argument(
        "--allow-missing-services",
        action="store_true",
        help="start without the services whose code does not exist yet (reported)",
    )
    up.add_argument("--ready-timeout", type=float, default=120.0, help="seconds to wait per service")
    # two gateway replicas by default: the demo shows a revocation taking effect on both
    up.add_argument("--gateways", type=int, default=2, help="query-gateway replicas (own port each)")
    up.add_argument("--resolvers", type=int, default=1, help="filter-resolver replicas")
    sub.add_parser("down", help="stop everything that `up` started")
    restart = sub.add_parser(
        "restart", help="stop one service (or double) and start it again as `up` did: same port and settings"
    )
    restart.add_argument("name", help="e.g. query-gateway, query-gateway-2, signaling, ds-connector")
    restart.add_argument("--ready-timeout", type=float, default=120.0, help="seconds to wait until ready")
    reload = sub.add_parser(
        "reload", help="a gateway re-reads its catalogue (SIGHUP) and says whether it took the file"
    )
    reload.add_argument("name", help="query-gateway or query-gateway-2")
    sub.add_parser("status", help="show each process; exit 1 when one is dead")
    sub.add_parser("demo", help="tell the dataspace story against the running stack, request by request")
    traces = sub.add_parser("traces", help="draw the last requests as a waterfall across the services")
    traces.add_argument("--last", type=int, default=5, help="how many traces (the latest; default 5)")
    traces.add_argument("--trace", default=None, help="one trace id (32 hex digits) instead")
    traces.add_argument("--width", type=int, default=48, help="characters of the time axis")
    args = parser.parse_args(argv)
    if args.command == "demo":
        return _demo(args.dir)
    if args.command == "traces":
        from dataplane_local import stack as stack_module
        from dataplane_local import traces as traces_module

        root = (args.dir or stack_module.default_root()).resolve()
        return traces_module.main(root, args.last, args.trace, max(args.width, 10))
    stack = Stack(args.dir)
    if args.command == "up":
        return stack.up(
            args.infra_only, args.allow_missing_services, args.ready_timeout, args.gateways, args.resolvers
        )
    if args.command == "down":
        return stack.down()
    if args.command == "restart":
        return stack.restart(args.name, args.ready_timeout)
    if args.command == "reload":
        from dataplane_local.reload import reload_gateway

        return reload_gateway(stack.pidfile, args.name, stack.log)
    return stack.status()


if __name__ == "__main__":
    raise SystemExit(main())
