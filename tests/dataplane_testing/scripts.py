"""The repository's scripts that are not in a package (the chart's `deploy/helm/render.py`, the
tools under `tools/`), imported by path for the tests that check them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load_script(relative: str, name: str) -> ModuleType:
    """`ROOT/relative` executed as module `name` (registered in sys.modules, where a dataclass of
    it looks its module up); a new module on every call."""
    spec = importlib.util.spec_from_file_location(name, ROOT / relative)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
