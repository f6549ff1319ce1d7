"""Issue 33 item 6: `dataplane-local reload NAME` sends a gateway of the running stack its SIGHUP
and says what came of it, read from the gateway's own reload counter: a good file is reloaded
(exit 0), a bad one refused with the old one kept (exit 1), a name that is no gateway refused (2)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from dataplane_local.procs import PidFile
from dataplane_local.reload import reload_gateway
from dataplane_testing import e2e as support


def _reloads(pidfile: PidFile, catalogue: Path) -> list[tuple[int, str]]:
    """Reload the good file, a bad one, the good one again, then ask signaling to: (exit, said)."""
    out: list[tuple[int, str]] = []

    def reload(name: str) -> None:
        said: list[str] = []
        out.append((reload_gateway(pidfile, name, said.append), said[-1]))

    good = catalogue.read_text()
    reload("query-gateway")
    try:
        catalogue.write_text("datasets: [{id: broken}]\n")  # refused by the schema: no table
        reload("query-gateway")
    finally:
        catalogue.write_text(good)
    reload("query-gateway")
    reload("signaling")
    return out


async def test_issue33_reload_says_reloaded_refused_or_no_such_gateway(system: support.System) -> None:
    catalogue = Path(system.stack.env_overrides["CATALOGUE_PATH"])
    (ok, said_ok), (bad, said_bad), (again, _), (other, said_other) = await asyncio.to_thread(
        _reloads, system.stack.pidfile, catalogue
    )
    assert (ok, said_ok) == (0, "query-gateway: catalogue reloaded")
    assert bad == 1 and said_bad.startswith("query-gateway: catalogue refused; the old one is still served")
    assert again == 0
    assert other == 2 and "only a gateway reloads" in said_other
    r = await system.http.get(f"{system.info.service_urls('query-gateway')[0]}/readyz")
    assert r.status_code == 200, r.text
