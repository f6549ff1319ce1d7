"""The image build's OCI writer (tools/images/build.py) without root: layers and layouts it writes
unpack to the same files, a tampered blob is refused, and the names it tags are the chart's
default image names. The full build and the started image run in CI (.ci/run, "images")."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from dataplane_testing.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


images = load_script("tools/images/build.py", "dataplane_images_build")
chart = load_script("deploy/helm/render.py", "dataplane_chart_render_images")


def _tree(tmp_path: Path) -> Path:
    root = tmp_path / "rootfs"
    (root / "app" / ".venv" / "bin").mkdir(parents=True)
    script = root / "app" / ".venv" / "bin" / "audit-relay"
    script.write_text("#!/app/.venv/bin/python\nprint('hi')\n")
    script.chmod(0o755)
    (root / "app" / ".venv" / "bin" / "python").symlink_to("/usr/bin/python3.11")
    (root / "tmp").mkdir()
    (root / "tmp" / "scratch").write_text("not in any layer")
    (root / "etc").mkdir()
    (root / "etc" / "passwd").write_text("dataplane:x:10001:10001::/:/usr/sbin/nologin\n")
    return root


def test_a_written_layout_unpacks_to_the_same_files(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    base = images.write_layer(root, ["etc", "tmp"], set(images._children(root, "tmp")), blobs)
    venv = images.write_layer(root, ["app"], set(), blobs)
    out = tmp_path / "out"
    images.write_image(out, "audit-relay", "9.9.9", [base, venv], blobs)

    index = json.loads((out / "audit-relay" / "index.json").read_text())
    assert index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"] == "9.9.9"
    dest = tmp_path / "unpacked"
    dest.mkdir()
    config = images.unpack(out / "audit-relay", dest)
    assert config["config"]["User"] == "10001:10001"
    assert config["config"]["Entrypoint"] == ["audit-relay"]
    assert "8003/tcp" in config["config"]["ExposedPorts"]
    unpacked = dest / "app" / ".venv" / "bin" / "audit-relay"
    assert unpacked.read_text() == (root / "app" / ".venv" / "bin" / "audit-relay").read_text()
    assert os.access(unpacked, os.X_OK)
    assert os.readlink(dest / "app" / ".venv" / "bin" / "python") == "/usr/bin/python3.11"
    assert (dest / "tmp").is_dir() and not (dest / "tmp" / "scratch").exists()  # an empty mount point


def test_layers_are_the_same_bytes_when_written_twice(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    digests = []
    for run in ("a", "b"):
        blobs = tmp_path / run
        blobs.mkdir()
        digests.append(images.write_layer(root, ["app", "etc"], set(), blobs)[1])
    assert digests[0] == digests[1]


def test_a_tampered_blob_is_refused(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    layer = images.write_layer(root, ["app"], set(), blobs)
    out = tmp_path / "out"
    images.write_image(out, "audit-relay", "1", [layer], blobs)
    blob = out / "audit-relay" / "blobs" / "sha256" / layer[1].split(":", 1)[1]
    blob.write_bytes(blob.read_bytes() + b"\0")
    with pytest.raises(SystemExit, match="does not match its digest"):
        images.unpack(out / "audit-relay", tmp_path / "dest")


def test_the_chart_defaults_to_the_names_the_build_tags() -> None:
    app_version = yaml.safe_load((ROOT / "deploy" / "helm" / "Chart.yaml").read_text())["appVersion"]
    assert images.app_version() == app_version
    assert set(images.SERVICES) == {"query-gateway", "signaling", "filter-resolver", "audit-relay"}
    for obj in chart.render_objects({}):
        if obj["kind"] == "Deployment":
            (container,) = obj["spec"]["template"]["spec"]["containers"]
            assert container["image"] == f"ghcr.io/dataplane/{container['name']}:{app_version}"
            assert container["name"] in images.SERVICES
