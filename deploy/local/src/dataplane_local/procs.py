"""Processes of the local stack: records kept in `.local/pids.json`, liveness, and stopping.

Every process the stack starts itself runs in its own session (`start_new_session=True`), so its
process group id is its pid and stopping the group also ends whatever it spawned. A record keeps
the process start time from `/proc`, so a pid reused by an unrelated process is never signalled."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class ProcRecord:
    name: str
    kind: str  # infra | double | service
    pid: int
    url: str = ""
    group: bool = True  # the pid leads its own process group
    start_time: str | None = None
    stop_cmd: list[str] | None = None
    log: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, name: str, kind: str, pid: int, **kw: Any) -> ProcRecord:
        return cls(name=name, kind=kind, pid=pid, start_time=start_time_of(pid), **kw)


def _stat(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # the command name (field 2) may hold spaces and parentheses: split after its last ')'
    rest = raw[raw.rindex(")") + 2 :].split()
    return rest  # rest[0] = state (field 3), rest[2] = pgrp (field 5), rest[19] = starttime (field 22)


def start_time_of(pid: int) -> str | None:
    st = _stat(pid)
    return st[19] if st else None


def is_alive(pid: int, start_time: str | None = None) -> bool:
    """Running and not a zombie; when `start_time` is known, also the same process as recorded."""
    if Path("/proc").is_dir():
        st = _stat(pid)
        if st is None or st[0] in ("Z", "X"):
            return False
        return start_time is None or st[19] == start_time
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def record_alive(rec: ProcRecord) -> bool:
    return is_alive(rec.pid, rec.start_time)


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group."""
    members: list[int] = []
    proc = Path("/proc")
    if not proc.is_dir():
        return [pgid] if is_alive(pgid) else []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        st = _stat(int(entry.name))
        if st and st[2] == str(pgid) and st[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def process_tree(pids: list[int]) -> dict[int, str | None]:
    """The live processes among `pids`, every live descendant of them (by parent pid) and every
    live member of their sessions, each with its start time: what "nothing left running" has to
    cover. The session catches a grandchild whose parent already exited (re-parented to init, no
    longer a descendant); a start time keeps a later reuse of the pid from counting as a survivor
    (`is_alive(pid, start_time)`). Take it while the processes run: afterwards the tree is gone."""
    proc = Path("/proc")
    if not proc.is_dir():
        return {p: None for p in pids if is_alive(p)}
    stats: dict[int, list[str]] = {}
    for entry in proc.iterdir():
        if entry.name.isdigit() and (st := _stat(int(entry.name))) and st[0] not in ("Z", "X"):
            stats[int(entry.name)] = st  # st[1] = parent pid (field 4), st[3] = session (field 6)
    roots = {p for p in pids if p in stats}
    found = set(roots) | {p for p, st in stats.items() if int(st[3]) in roots}
    grew = True
    while grew:
        more = {p for p, st in stats.items() if int(st[1]) in found} - found
        found |= more
        grew = bool(more)
    return {p: stats[p][19] for p in found}


def survivors(tree: dict[int, str | None]) -> list[int]:
    """The processes of a `process_tree` snapshot that still run (the same process, not a reuse)."""
    return sorted(p for p, start in tree.items() if is_alive(p, start))


def _signal(rec: ProcRecord, sig: signal.Signals) -> None:
    try:
        if rec.group:
            os.killpg(rec.pid, sig)
        else:
            os.kill(rec.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _gone(rec: ProcRecord) -> bool:
    if rec.group:
        return not group_members(rec.pid)
    return not record_alive(rec)


def _wait_gone(rec: ProcRecord, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _reap(rec.pid)
        if _gone(rec):
            return True
        time.sleep(0.05)
    return _gone(rec)


def _reap(pid: int) -> None:
    # only succeeds for our own children (started in this process); others are reaped by init
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def stop_record(rec: ProcRecord, timeout: float = 10.0) -> bool:
    """Its own stop command (if any), then SIGTERM, then SIGKILL. True when nothing is left."""
    if not record_alive(rec) and _gone(rec):
        return True
    if rec.stop_cmd:
        subprocess.run(rec.stop_cmd, check=False, capture_output=True, timeout=60)
        if _wait_gone(rec, timeout):
            return True
    if not rec.group and not record_alive(rec):
        return True
    _signal(rec, signal.SIGTERM)
    if _wait_gone(rec, timeout):
        return True
    _signal(rec, signal.SIGKILL)
    return _wait_gone(rec, 5.0)


class PidFile:
    """`pids.json`: the records, rewritten after every start so a crashed `up` can be stopped."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> list[ProcRecord]:
        if not self.path.exists():
            return []
        data = json.loads(self.path.read_text())
        return [ProcRecord(**r) for r in data.get("processes", [])]

    def save(self, records: list[ProcRecord]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"processes": [asdict(r) for r in records]}, indent=2))
        tmp.replace(self.path)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def stop_all(records: list[ProcRecord]) -> list[str]:
    """Stop in reverse start order; returns the names that could not be stopped."""
    left: list[str] = []
    for rec in reversed(records):
        if not stop_record(rec):
            left.append(f"{rec.name} (pid {rec.pid})")
    return left


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    """SIGTERM a child we started, give it `timeout` to shut down cleanly, then SIGKILL it."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def descendants(root: int) -> list[int]:
    """`root` and every descendant by parent pid (PostgreSQL's backends are the postmaster's
    children) — not its session, which may hold the caller."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


@contextlib.contextmanager
def paused(root: int) -> Iterator[None]:
    """SIGSTOP a process and its descendants (a fault for tests: a server that stops answering);
    SIGCONT them whatever happens inside."""
    pids = descendants(root)
    try:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        yield
    finally:
        for pid in descendants(root) + pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
