"""`dataplane-local reload NAME`: a gateway of the running stack re-reads its catalogue (SIGHUP),
and the command says whether it took the new file (docs/operations.md, the catalogue reload)."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable

import httpx

from dataplane_local.procs import PidFile, record_alive

RELOADS = re.compile(r'^query_gateway_catalogue_reloads_total\{outcome="(\w+)"\} ([0-9.e+]+)$', re.M)


def reload_gateway(pidfile: PidFile, name: str, log: Callable[[str], None], timeout_s: float = 30.0) -> int:
    """SIGHUP to the named gateway, then its reload counter read until it moves: 0 reloaded,
    1 refused (the old file is still served; its log says why) or no answer, 2 no such gateway."""
    gateways = [r for r in pidfile.load() if r.name.startswith("query-gateway") and record_alive(r)]
    rec = next((r for r in gateways if r.name == name), None)
    if rec is None:
        known = ", ".join(r.name for r in gateways) or "none (is a stack running? dataplane-local up)"
        log(f"no running gateway {name!r}: only a gateway reloads (its catalogue); running: {known}")
        return 2
    before = _reloads(rec.url)
    os.kill(rec.pid, signal.SIGHUP)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = _reloads(rec.url)
        for outcome in ("reloaded", "refused"):
            if now.get(outcome, 0.0) > before.get(outcome, 0.0):
                if outcome == "reloaded":
                    log(f"{name}: catalogue reloaded")
                    return 0
                log(f"{name}: catalogue refused; the old one is still served, see {rec.log or 'its log'}")
                return 1
    log(f"{name}: no reload seen within {timeout_s:.0f}s (pid {rec.pid})")
    return 1


def _reloads(url: str) -> dict[str, float]:
    try:
        text = httpx.get(f"{url}/metrics", timeout=2.0).text
    except httpx.HTTPError:
        return {}
    return {outcome: float(value) for outcome, value in RELOADS.findall(text)}
