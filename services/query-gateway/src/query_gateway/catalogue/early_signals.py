"""A SIGHUP that arrives while the gateway starts (docs/operations.md, "Reloading the catalogue").

SIGHUP's default action ends the process, and the event loop binds the reload to it only once the
catalogue has been read (reload.py). An operator who sends it early — a config-map update racing a
rollout — must not kill a starting replica: until then the signal is remembered, and the reload it
asked for runs as soon as start-up has finished. Kept free of imports so `main` can bind it before
loading anything else."""

from __future__ import annotations

import signal
import threading
from types import FrameType

_ASKED = threading.Event()


def _remember(_signum: int, _frame: FrameType | None) -> None:
    _ASKED.set()


def remember_early_reloads() -> None:
    signal.signal(signal.SIGHUP, _remember)


def take_early_reload() -> bool:
    """Whether a SIGHUP came before the loop's handler was bound (and forget it)."""
    asked = _ASKED.is_set()
    _ASKED.clear()
    return asked
