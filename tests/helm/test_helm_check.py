"""CI's chart check (.ci/helm-check.sh) really runs here: strict Kubernetes 1.33 validation and the
published npm models for the custom resources; and each of those validators can say no. Also the
Dockerfiles' shape, since no Docker engine can build them here."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
VALIDATE = ROOT / "deploy" / "helm" / "validate"
SERVICES = {"query-gateway": 8000, "signaling": 8001, "filter-resolver": 8002, "audit-relay": 8003}

# The whole chart check's own budget, and pytest's for that test a minute above it (the global
# `timeout = 300` in pyproject.toml would otherwise kill it first, without the script's output).
HELM_CHECK_TIMEOUT_S = 600


needs_node = pytest.mark.usefixtures("node")


@pytest.fixture(scope="module")
def node_models(node_modules: Path) -> Path:
    return node_modules / "validate-crds.mjs"


@needs_node
@pytest.mark.timeout(HELM_CHECK_TIMEOUT_S + 60)
def test_helm_check_script_passes_on_the_chart() -> None:
    run = subprocess.run(
        ["bash", str(ROOT / ".ci" / "helm-check.sh")],
        cwd=ROOT,
        check=False,
        capture_output=True,
        text=True,
        timeout=HELM_CHECK_TIMEOUT_S,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    for case in ("default", "cluster-fit", "everything-enabled", "minimal"):
        assert f"== render {case}" in run.stdout
    assert "all manifests valid" in run.stdout
    (summary,) = [line for line in run.stdout.splitlines() if line.startswith("validated ")]
    assert sorted(summary.removeprefix("validated ").split("; ")[0].split(", ")) == [
        "1 PrometheusRule",
        "2 ScaledObject",
        "4 ServiceMonitor",
    ]
    assert summary.endswith("; 0 failure(s)")
    assert '"expressions":' in run.stdout  # the PromQL step ran


SCALED_OBJECT: dict[str, Any] = {
    "apiVersion": "keda.sh/v1alpha1",
    "kind": "ScaledObject",
    "metadata": {"name": "resolver"},
    "spec": {
        "scaleTargetRef": {"name": "resolver"},
        "maxReplicaCount": 6,
        "triggers": [
            {"type": "kafka", "metadata": {"topic": "t", "consumerGroup": "g", "lagThreshold": "5"}}
        ],
    },
}


@needs_node
@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        (
            {**SCALED_OBJECT, "spec": {**SCALED_OBJECT["spec"], "maxReplicaCount": "six"}},
            "maxReplicaCount must be integer",
        ),
        (
            {
                "apiVersion": "monitoring.coreos.com/v1",
                "kind": "ServiceMonitor",
                "metadata": {"name": "m"},
                "spec": {"selector": {}, "endpoints": [{"port": 8000}]},
            },
            "port must be string",
        ),
        ({**SCALED_OBJECT, "apiVersion": "keda.sh/v2"}, "no published model"),
    ],
)
def test_crd_models_refuse_a_bad_custom_resource(
    node_models: Path, tmp_path: Path, doc: object, expected: str
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    run = subprocess.run(
        ["node", str(node_models), str(bad)], check=False, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 1
    assert expected in run.stderr


@needs_node
def test_crd_check_is_not_vacuous(node_models: Path, tmp_path: Path) -> None:
    empty = tmp_path / "none.yaml"
    empty.write_text("")
    run = subprocess.run(
        ["node", str(node_models), "--require", "ScaledObject", str(empty)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1
    assert "no ScaledObject was rendered" in run.stderr


def test_strict_kubernetes_validation_refuses_unknown_fields(tmp_path: Path) -> None:
    manifest = tmp_path / "svc.yaml"
    manifest.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": "s"},
                "spec": {"ports": [{"port": 80}], "selectr": {"app": "x"}},
            }
        )
    )
    cli = Path(sys.executable).with_name("kubernetes-validate")
    run = subprocess.run(
        [str(cli), "--strict", "-k", "1.33.0", str(manifest)], check=False, capture_output=True, text=True
    )
    assert run.returncode == 1
    assert "selectr" in run.stdout + run.stderr


@pytest.mark.parametrize("service", SERVICES)
def test_dockerfile_locked_sync_of_one_service_non_root(service: str) -> None:
    text = (ROOT / "services" / service / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim\b", text, re.M)
    assert re.search(r"pip install --no-cache-dir uv==[0-9.]+", text)
    assert f"uv sync --locked --no-dev --no-editable --package dataplane-{service}" in text
    user = re.findall(r"^USER (\d+)(?::(\d+))?$", text, re.M)
    assert user and int(user[-1][0]) > 0  # numeric, so runAsNonRoot can check it
    chart_uid = yaml.safe_load((ROOT / "deploy" / "helm" / "values.yaml").read_text())["global"]["runAsUser"]
    assert int(user[-1][0]) == chart_uid
    (entrypoint,) = re.findall(r'^ENTRYPOINT \["([^"]+)"\]$', text, re.M)
    scripts = tomllib.loads((ROOT / "services" / service / "pyproject.toml").read_text())["project"][
        "scripts"
    ]
    assert entrypoint == service and entrypoint in scripts
    assert f"EXPOSE {SERVICES[service]}" in text


@pytest.mark.parametrize(("ci", "outcome"), [("true", "1 error"), ("", "1 skipped")])
def test_without_node_ci_fails_where_a_developer_skips(tmp_path: Path, ci: str, outcome: str) -> None:
    """Run one node-needing test of this module with no node/npm on PATH (only the interpreter's
    directory): skipped locally, a failure when CI is set, so CI can never skip chart validation."""
    env = {**os.environ, "PATH": str(Path(sys.executable).parent), "CI": ci}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            f"{Path(__file__).resolve()}::test_crd_check_is_not_vacuous",
            "-p",
            "no:cacheprovider",
            "-q",
            "-rfs",
        ],
        cwd=ROOT,
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert outcome in run.stdout, run.stdout + run.stderr
    if ci:
        assert run.returncode == 1
        assert "node and npm are required in CI" in run.stdout
    else:
        assert run.returncode == 0
