"""CPU time of the benchmarked processes, from /proc (Linux), for CPU ms per request.

A process's CPU is its utime + stime (every thread), plus the CPU of the children it has waited
for (cutime + cstime) and of its live descendants: PostgreSQL's figure is the postmaster and all
its backends, a backend that ended during a run counted through the postmaster's cutime."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int | str) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command (field 2) may hold spaces and parentheses: fields after its last ')'
    return raw[raw.rindex(")") + 2 :].split()


def _table() -> dict[int, tuple[int, float]]:
    """Every live process: pid → (parent pid, own + waited-for children's CPU seconds)."""
    out: dict[int, tuple[int, float]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        f = _stat_fields(entry.name)
        if f is None or f[0] in ("Z", "X"):
            continue
        # fields 14-17 (utime stime cutime cstime) are f[11:15]; field 4 (ppid) is f[1]
        out[int(entry.name)] = (int(f[1]), sum(int(x) for x in f[11:15]) / TICK)
    return out


def tree_seconds(pids: Iterable[int]) -> dict[int, float]:
    """CPU seconds so far of each pid with all its live descendants; a pid gone maps to nan."""
    table = _table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)

    def total(pid: int) -> float:
        seconds = table[pid][1]
        stack = list(children.get(pid, ()))
        while stack:
            child = stack.pop()
            seconds += table[child][1]
            stack.extend(children.get(child, ()))
        return seconds

    return {pid: (total(pid) if pid in table else float("nan")) for pid in pids}


def pid_listening_on(port: int) -> int | None:
    """The process with a listening TCP socket on `port` (/proc/net/tcp → socket inode → fd)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(cols[9])
    if not inodes:
        return None
    wanted = {f"socket:[{i}]" for i in inodes}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            for fd in os.scandir(f"/proc/{entry.name}/fd"):
                try:
                    if os.readlink(fd.path) in wanted:
                        return int(entry.name)
                except OSError:
                    continue
        except OSError:
            continue
    return None


class Processes:
    """Named processes whose CPU is sampled together; `snapshot()` → name → CPU seconds."""

    def __init__(self) -> None:
        self.pids: dict[str, int] = {}

    def add(self, name: str, pid: int | None) -> None:
        if pid is not None:
            self.pids[name] = pid

    def remove(self, name: str) -> None:
        self.pids.pop(name, None)

    def snapshot(self) -> dict[str, float]:
        seconds = tree_seconds(self.pids.values())
        return {name: seconds[pid] for name, pid in self.pids.items()}
