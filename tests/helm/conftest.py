"""Node.js for the chart's validators (deploy/helm/validate/): the published models of the custom
resources and Prometheus's PromQL grammar. A developer machine without node skips the tests that
need it; CI must never pass without validating the chart, so there they fail."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

VALIDATE = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "validate"


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


@pytest.fixture(scope="module")
def node() -> None:
    if shutil.which("node") is None or shutil.which("npm") is None:
        if in_ci():
            pytest.fail("node and npm are required in CI: the chart's custom resources must be validated")
        pytest.skip("no node/npm (in CI this fails)")


@pytest.fixture(scope="module")
def node_modules(node: None) -> Path:
    """The validators' directory, its node_modules installed from the lock file as CI does."""
    if not (VALIDATE / "node_modules").is_dir():
        subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=VALIDATE,
            check=True,
            timeout=240,
        )
    return VALIDATE
