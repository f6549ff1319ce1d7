"""Copies the Kubernetes object schemas the chart's values embed (affinity, topology spread
constraints, environment variables, volumes and mounts, containers for `initContainers` and
`sidecars`) into `deploy/helm/values.schema.json`, so those values are checked as strictly as the
rest: the Kubernetes 1.33 strict definitions that `kubernetes-validate` ships (unknown fields
refused), with descriptions and formats dropped.

    uv run python tools/chart_schema.py           # rewrite the `io.k8s.*` definitions
    uv run python tools/chart_schema.py --check   # exit 1 when the committed file differs

Only the definitions named `io.k8s.*` are written; the rest of the schema is edited by hand."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = ROOT / "deploy" / "helm" / "values.schema.json"
KUBERNETES = "1.33.0"
# The objects a value may hold; everything they reference comes along.
ROOTS = (
    "io.k8s.api.core.v1.Affinity",
    "io.k8s.api.core.v1.TopologySpreadConstraint",
    "io.k8s.api.core.v1.EnvVar",
    "io.k8s.api.core.v1.Volume",
    "io.k8s.api.core.v1.VolumeMount",
    "io.k8s.api.core.v1.Container",
    "io.k8s.api.core.v1.Probe",
)
PREFIX = "io.k8s."
# Documentation and hints a values check does not need (an unknown `format` could even refuse).
DROPPED = {"description", "format"}


def _strict_definitions() -> dict[str, Any]:
    base = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    path = base / f"v{KUBERNETES}-local-strict" / "_definitions.json"
    defs: dict[str, Any] = json.loads(path.read_text())["$defs"]
    return defs


def _clean(node: Any) -> Any:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key in DROPPED or key.startswith("x-kubernetes-"):
                continue
            if key == "$ref":
                out[key] = "#/definitions/" + str(value).rsplit("/", 1)[-1]
            else:
                out[key] = _clean(value)
        return out
    if isinstance(node, list):
        return [_clean(v) for v in node]
    return node


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [str(v).rsplit("/", 1)[-1] for k, v in node.items() if k == "$ref"]
        return found + [r for k, v in node.items() if k != "$ref" for r in _refs(v)]
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    return []


def kubernetes_definitions() -> dict[str, Any]:
    """The roots and every definition they reach, cleaned, in name order."""
    source = _strict_definitions()
    wanted: set[str] = set()
    todo = list(ROOTS)
    while todo:
        name = todo.pop()
        if name not in wanted:
            wanted.add(name)
            todo.extend(_refs(source[name]))
    return {name: _clean(source[name]) for name in sorted(wanted)}


def generated() -> str:
    schema = json.loads(SCHEMA.read_text())
    own = {k: v for k, v in schema["definitions"].items() if not k.startswith(PREFIX)}
    schema["definitions"] = {**own, **kubernetes_definitions()}
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when the committed file differs")
    args = parser.parse_args(argv)
    text = generated()
    if args.check:
        if SCHEMA.read_text() != text:
            print(
                f"{SCHEMA.relative_to(ROOT)} is stale: run uv run python tools/chart_schema.py",
                file=sys.stderr,
            )
            return 1
        return 0
    SCHEMA.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
