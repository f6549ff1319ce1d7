"""Render the dataplane chart without a helm binary (helm-python-sdk), for CI and the tests.

    python deploy/helm/render.py OUT.yaml [-f VALUES.yaml ...] [--crds CRDS.yaml]

validates the merged values against values.schema.json, renders every template into one
multi-document YAML file, lints the chart and prints the findings. With --crds, the custom
resources (KEDA, prometheus-operator) go to that file instead of OUT.yaml, because they are
validated with their own published models, not with the Kubernetes schemas. Exit 1 with a readable
message when the values are refused or a template fails (say, a replica maximum above the
partitions of the consumed topic).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

CHART_DIR = Path(__file__).resolve().parent
RELEASE = "dataplane"
NAMESPACE = "dataplane"
# API groups whose kinds are custom resources: the Kubernetes schemas don't know them.
CRD_GROUPS = ("keda.sh/", "monitoring.coreos.com/")

# helm's support.Severity: Unknown, Info, Warning, Error.
_SEVERITY = {0: "unknown", 1: "info", 2: "warning", 3: "error"}


class ChartError(Exception):
    """The chart refused these values: schema violation, template `fail`, or lint error."""


def load_values(*files: Path) -> dict[str, Any]:
    """Merge values files left to right as `helm -f a -f b` does: maps deeply, anything else replaced."""
    merged: dict[str, Any] = {}
    for file in files:
        data = yaml.safe_load(file.read_text()) or {}
        if not isinstance(data, dict):
            raise ChartError(f"{file}: a values file must hold a mapping")
        _deep_merge(merged, data)
    return merged


def _deep_merge(into: dict[str, Any], new: dict[str, Any]) -> None:
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _deep_merge(into[key], value)
        else:
            into[key] = value


def lint(values: dict[str, Any] | None = None) -> list[str]:
    """The lint findings as text; raises ChartError when any of them is an error."""
    report = helm.lint(str(CHART_DIR), values or {}, strict=True, namespace=NAMESPACE)
    if report.get("errors"):
        raise ChartError("helm lint failed:\n" + "\n".join(str(e) for e in report["errors"]))
    return [
        f"[{_SEVERITY.get(m.get('severity'), m.get('severity'))}] {m.get('path', '')}: {m.get('error', '')}"
        for m in report.get("messages") or []
    ]


def render(values: dict[str, Any] | None = None) -> str:
    """Schema-check the values, then render the chart to one multi-document YAML string."""
    with helm.Chart.load(str(CHART_DIR)) as chart:
        try:
            chart.validate_schema(chart.merge_values(values or {}))
        except helm.HelmValuesError as exc:
            raise ChartError(f"values rejected by values.schema.json:\n{exc}") from exc
        try:
            manifests = chart.render(values or {}, name=RELEASE, namespace=NAMESPACE, is_install=True)
        except helm.HelmRenderError as exc:
            raise ChartError(f"chart refused to render:\n{exc}") from exc
    docs = [
        body.strip() for path, body in sorted(manifests.items()) if path.endswith(".yaml") and body.strip()
    ]
    return "---\n" + "\n---\n".join(docs) + "\n"


def render_objects(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The rendered manifests as parsed objects (empty documents dropped)."""
    return [doc for doc in yaml.safe_load_all(render(values)) if doc]


def is_custom_resource(obj: dict[str, Any]) -> bool:
    return str(obj.get("apiVersion", "")).startswith(CRD_GROUPS)


def _dump(objs: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(objs, sort_keys=False) if objs else ""


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", type=Path)
    parser.add_argument("-f", "--values", type=Path, action="append", default=[])
    parser.add_argument("--crds", type=Path, help="write the custom resources here instead of OUT")
    args = parser.parse_args(argv)
    try:
        values = load_values(*args.values)
        rendered = render(values)  # first: its schema and `fail` messages are the readable ones
        for message in lint(values):
            print(f"lint {message}")
    except ChartError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.crds is None:
        args.out.write_text(rendered)
        return 0
    objs = [doc for doc in yaml.safe_load_all(rendered) if doc]
    args.out.write_text(_dump([o for o in objs if not is_custom_resource(o)]))
    args.crds.write_text(_dump([o for o in objs if is_custom_resource(o)]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
