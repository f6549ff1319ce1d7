"""docs/configuration.md tells operators each setting's default; the code decides it. Every row of
the reference whose default cell opens with a literal (`5`, `true`, `INFO`) must equal the default
of that setting in every service's settings class that declares it (issue 35: the relay's backoff
cap and buffer were documented as 60 and 512 while the code said 5 and 4096)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic_core import PydanticUndefined

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "configuration.md"
SETTINGS = (
    "query_gateway.settings",
    "signaling.settings",
    "filter_resolver.settings",
    "audit_relay.settings",
)
NAME = re.compile(r"`([A-Z][A-Z0-9_]*)`")
# the literals a default cell opens with: `0.5`, `5` (one per name of the row, in order)
LITERALS = re.compile(r"^(`[^`]*`(?:, `[^`]*`)*)")


def _documented() -> list[tuple[str, str]]:
    """(NAME, documented default) for each row whose default cell opens with one literal per
    name: `| `A`, `B` | `0.5`, `5` | … |` gives A → 0.5 and B → 5."""
    rows = []
    for line in DOC.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if not line.startswith("| `") or len(cells) < 3:
            continue
        names = NAME.findall(cells[0])
        literals = LITERALS.match(cells[1])
        if not names or literals is None or "=" in cells[0]:
            continue
        values = re.findall(r"`([^`]*)`", literals.group(1))
        if len(values) == len(names):
            rows.extend(zip(names, values, strict=True))
    return rows


def _defaults(field: str) -> dict[str, Any]:
    """module → the field's default, for every settings class that declares it."""
    found: dict[str, Any] = {}
    for module in SETTINGS:
        fields = importlib.import_module(module).Settings.model_fields
        if field in fields:
            info = fields[field]
            default = info.default
            if default is PydanticUndefined and info.default_factory is not None:
                default = info.default_factory()  # type: ignore[call-arg]
            found[module] = default
    return found


def _same(documented: str, default: Any) -> bool:
    if isinstance(default, bool):
        return documented == str(default).lower()
    if isinstance(default, int | float):
        try:
            return float(documented) == float(default)
        except ValueError:
            return False
    if default is None:
        # None in code is "derived at start-up"; the document writes the rule with a placeholder
        # (`{base}/…`). Any other literal is a default the code does not have
        return re.search(r"\{[a-z_]+\}", documented) is not None
    if isinstance(default, list):
        return [part.strip() for part in documented.split(",") if part.strip()] == [str(v) for v in default]
    if isinstance(default, dict):
        return documented.replace(" ", "") == "{}" and not default
    return documented == str(getattr(default, "value", default))


def test_every_documented_default_is_the_code_default() -> None:
    checked, wrong = 0, []
    for name, documented in _documented():
        defaults = _defaults(name.lower())
        for module, default in defaults.items():
            checked += 1
            if not _same(documented, default):
                wrong.append(f"{name}: documented {documented!r}, {module} says {default!r}")
    assert not wrong, "\n".join(wrong)
    # the reference documents dozens of settings with a literal default: a parse that finds
    # almost none is a broken test, not a correct document
    assert checked >= 80, checked


@pytest.mark.parametrize(
    ("documented", "default", "same"),
    [
        ("5", 5.0, True),
        ("60", 5.0, False),
        ("true", True, True),
        ("false", True, False),
        ("INFO", "INFO", True),
        ("{base}/x", None, True),
        ("x", None, False),
        ("a, b", ["a", "b"], True),
        ("a", ["a", "b"], False),
    ],
)
def test_the_comparison_itself(documented: str, default: Any, same: bool) -> None:
    assert _same(documented, default) is same
