"""The catalogue at start-up and on SIGHUP (docs/gateway.md, "GS-08"; docs/operations.md,
"Reloading the catalogue"), GS-08: a handler name neither built in nor a declared plugin refuses
start-up naming it; a real `query-gateway` process reloads its catalogue file on SIGHUP when the
new file passes every check, and keeps serving the old one — saying why — when it does not."""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from dataplane_local import infra
from dataplane_local.timeouts import scaled
from dataplane_testing.gateway import CATALOGUE, World, process_env
from dataplane_testing.metrics import series as metric
from query_gateway.app import StartupRefused, create_app
from query_gateway.catalogue.load import unknown_handlers

STATS = {"sql": "SELECT id FROM stats ORDER BY id"}
COPY = {"sql": "SELECT id FROM stats_copy ORDER BY id"}
STATS_COPY = """
  - id: stats_copy          # added by the reload
    table: public.stats
    access_level: open
    expose: true
    row_filters:
      person: {handler: allow_all, binds: person}
      organization: {handler: allow_all, binds: organization}
"""
TYPO = """
  - id: typo
    table: public.stats
    access_level: open
    expose: true
    row_filters:
      person: {handler: subject_key_mach, args: {column: label, key_type: pod}, binds: person}
      organization: {handler: allow_all, binds: organization}
"""


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


Running = tuple[str, Path, subprocess.Popen[bytes], Path]  # url, catalogue file, process, its log


@contextlib.contextmanager
def _gateway(
    world: World, tmp_path: Path, starting: Callable[[subprocess.Popen[bytes], str], None]
) -> Iterator[Running]:
    """A real `query-gateway` process over a copy of the catalogue, ready; `starting` is called
    with it as soon as it is spawned."""
    catalogue = tmp_path / "catalogue.yaml"
    shutil.copy(CATALOGUE, catalogue)
    port = infra.free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "gateway.log"
    script = shutil.which("query-gateway")
    assert script is not None
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [script],
            env=process_env(world.settings(catalogue_path=str(catalogue)), port),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        starting(proc, url)
        deadline = time.monotonic() + scaled(60)
        while not _ready(url):
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, (
                "the gateway did not become ready:\n" + log.read_text()[-3000:]
            )
            time.sleep(0.2)
        yield url, catalogue, proc, log
    finally:
        proc.terminate()
        try:
            proc.wait(scaled(15))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def gateway_process(world: World, tmp_path: Path) -> Iterator[Running]:
    with _gateway(world, tmp_path, lambda _proc, _url: None) as running:
        yield running


def _wait_for(what: str, check: Any, log: Path) -> None:
    deadline = time.monotonic() + scaled(30)
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}:\n" + log.read_text()[-3000:]
        time.sleep(0.1)


def _reloads(url: str, outcome: str) -> float:
    return metric(httpx.get(f"{url}/metrics").text, "query_gateway_catalogue_reloads_total", outcome=outcome)


def _digest(url: str) -> str:
    lines = [
        line
        for line in httpx.get(f"{url}/metrics").text.splitlines()
        if line.startswith("query_gateway_catalogue_info{") and line.endswith(" 1.0")
    ]
    assert len(lines) == 1, lines  # exactly one file is being served
    return lines[0].split('digest="', 1)[1].split('"', 1)[0]


def test_gs08_sighup_serves_a_good_file_and_keeps_the_old_one_on_a_bad_file(
    gateway_process: Running,
) -> None:
    url, catalogue, proc, log = gateway_process
    assert httpx.post(f"{url}/query", json=STATS).status_code == 200
    assert httpx.post(f"{url}/query", json=COPY).json()["error"] == "unknown_dataset"
    first = _digest(url)

    # a good file: checked whole, then served — the new dataset answers
    catalogue.write_text(CATALOGUE.read_text() + STATS_COPY)
    proc.send_signal(signal.SIGHUP)
    _wait_for("the reload", lambda: _reloads(url, "reloaded") == 1, log)
    copy = httpx.post(f"{url}/query", json=COPY)
    assert copy.status_code == 200 and [r["id"] for r in copy.json()["items"]] == [1, 2], copy.text
    second = _digest(url)
    assert second != first

    # a bad file (a handler name with a typo): refused, the previous file still served, and why
    catalogue.write_text(CATALOGUE.read_text() + STATS_COPY + TYPO)
    proc.send_signal(signal.SIGHUP)
    _wait_for("the refusal", lambda: _reloads(url, "refused") == 1, log)
    assert httpx.post(f"{url}/query", json=COPY).status_code == 200
    assert (
        httpx.post(f"{url}/query", json={"sql": "SELECT id FROM typo"}).json()["error"] == "unknown_dataset"
    )
    assert _digest(url) == second
    text = log.read_text()
    assert "catalogue_reload_refused" in text and "typo.person: subject_key_mach" in text
    assert proc.poll() is None and _ready(url)


async def test_gs08_a_handler_neither_built_in_nor_declared_refuses_start_up(
    world: World, tmp_path: Path
) -> None:
    bad = tmp_path / "typo.yaml"
    bad.write_text(CATALOGUE.read_text() + TYPO)
    app = create_app(world.settings(catalogue_path=str(bad)))
    with pytest.raises(StartupRefused, match=r"typo\.person: subject_key_mach.*ROW_FILTERS_PLUGIN_HANDLERS"):
        async with app.router.lifespan_context(app):
            pass
    # a plugin the deployment's resolvers load is declared, and then accepted
    declared = world.settings(catalogue_path=str(bad), row_filters_plugin_handlers="subject_key_mach")
    assert declared.row_filters_plugin_handlers == ("subject_key_mach",)
    from dataplane_contracts.catalogue import load_catalogue

    assert unknown_handlers(load_catalogue(bad), declared.row_filters_plugin_handlers) == []
    assert unknown_handlers(load_catalogue(bad), ()) == ["typo.person: subject_key_mach"]


def _catches_sighup(pid: int) -> bool:
    """Whether the process has bound a handler to SIGHUP (bit 0 of SigCgt is signal 1)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next(line for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught.split()[1], 16) & 1)


def test_gs08_a_sighup_during_start_up_is_reloaded_once_started(world: World, tmp_path: Path) -> None:
    """SIGHUP's default action ends a process: one sent while the gateway is still starting (before
    it is ready) must neither kill it nor be lost — the reload runs once start-up has finished."""
    sent_before_ready: list[bool] = []

    def hup_while_starting(proc: subprocess.Popen[bytes], url: str) -> None:
        deadline = time.monotonic() + scaled(30)
        while not _catches_sighup(proc.pid):
            assert proc.poll() is None and time.monotonic() < deadline, "SIGHUP was never bound"
            time.sleep(0.01)
        sent_before_ready.append(not _ready(url))
        proc.send_signal(signal.SIGHUP)

    with _gateway(world, tmp_path, hup_while_starting) as (url, _catalogue, proc, log):
        _wait_for("the reload asked during start-up", lambda: _reloads(url, "reloaded") == 1, log)
        assert proc.poll() is None and _ready(url)
        assert httpx.post(f"{url}/query", json=STATS).status_code == 200
        assert "catalogue_reload_asked_while_starting" in log.read_text()
    assert sent_before_ready == [True]
