"""The image build's OCI writer (tools/images/build.py) without root: layers and multi-platform
layouts it writes unpack to the same files per architecture, a tampered blob is refused, the
names it tags are the chart's default image names, what is missing on a host is named in one line,
and the packages left out on arm64 are exactly those uv.lock has no wheel for. The full build of
both architectures and the started image run in CI (.ci/run, "images")."""

from __future__ import annotations

import json
import os
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.markers import Marker

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
    images.write_image(out, "audit-relay", "9.9.9", {"amd64": [base, venv]}, blobs)

    index = json.loads((out / "audit-relay" / "index.json").read_text())
    (named,) = index["manifests"]
    assert named["annotations"]["org.opencontainers.image.ref.name"] == "9.9.9"
    dest = tmp_path / "unpacked"
    dest.mkdir()
    config = images.unpack(out / "audit-relay", dest, "amd64")
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
    images.write_image(out, "audit-relay", "1", {"amd64": [layer]}, blobs)
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
            # what .github/workflows/release.yml pushes for the owner `dataplane`
            assert container["image"] == f"ghcr.io/dataplane/dataplane/{container['name']}:{app_version}"
            assert container["name"] in images.SERVICES


def test_one_tag_names_an_index_of_both_architectures(tmp_path: Path) -> None:
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    layers = {}
    for arch in ("amd64", "arm64"):
        root = tmp_path / arch
        (root / "app").mkdir(parents=True)
        (root / "app" / "which").write_text(arch)
        layers[arch] = [images.write_layer(root, ["app"], set(), blobs)]
    out = tmp_path / "out"
    digest = images.write_image(out, "signaling", "2.0.0", layers, blobs)
    layout = out / "signaling"

    # index.json: one descriptor, the tag, of an image index (what `skopeo copy --all` follows)
    (named,) = json.loads((layout / "index.json").read_text())["manifests"]
    assert named["mediaType"] == "application/vnd.oci.image.index.v1+json"
    assert named["digest"] == digest
    image_index = json.loads((layout / "blobs" / "sha256" / digest.split(":", 1)[1]).read_bytes())
    assert [m["platform"] for m in image_index["manifests"]] == [
        {"architecture": "amd64", "os": "linux"},
        {"architecture": "arm64", "os": "linux"},
    ]
    assert set(images.platforms(layout)) == {"amd64", "arm64"}
    for arch in ("amd64", "arm64"):
        dest = tmp_path / f"unpacked-{arch}"
        dest.mkdir()
        config = images.unpack(layout, dest, arch)
        assert config["architecture"] == arch and config["os"] == "linux"
        assert (dest / "app" / "which").read_text() == arch
    with pytest.raises(SystemExit, match="no riscv64 image"):
        images.unpack(layout, tmp_path / "none", "riscv64")


def test_elf_machine_reads_the_architecture(tmp_path: Path) -> None:
    host = images.elf_machine(Path(sys.executable).resolve())
    assert host == images.ARCHES[images.HOST_ARCH][2]
    (tmp_path / "script").write_text("#!/bin/sh\n")
    assert images.elf_machine(tmp_path / "script") is None
    (tmp_path / "bin").mkdir()
    arm = bytearray(Path(sys.executable).resolve().read_bytes()[:64])
    arm[18:20] = (0xB7).to_bytes(2, "little")
    (tmp_path / "bin" / "lib.so").write_bytes(bytes(arm))
    other = "amd64" if images.HOST_ARCH == "arm64" else "arm64"
    assert images.foreign_elves(tmp_path, other) == []
    assert images.foreign_elves(tmp_path, "amd64") == ["bin/lib.so"]


def _binfmt(tmp_path: Path, entry: str | None) -> Path:
    binfmt = tmp_path / "binfmt_misc"
    binfmt.mkdir()
    (binfmt / "status").write_text("enabled\n")
    interpreter = tmp_path / "qemu-aarch64"
    interpreter.write_text("")
    if entry is not None:
        (binfmt / "qemu-aarch64").write_text(entry.format(interpreter=interpreter))
    return binfmt


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        (None, "needs qemu-aarch64 registered in binfmt_misc: apt-get install qemu-user-static"),
        ("disabled\ninterpreter {interpreter}\nflags: POF\n", "is disabled"),
        ("enabled\ninterpreter {interpreter}\nflags: PO\n", "with the F flag"),
        ("enabled\ninterpreter /nonexistent/qemu\nflags: POF\n", "/nonexistent/qemu is missing"),
        ("enabled\ninterpreter {interpreter}\nflags: POF\n", None),
    ],
)
def test_a_foreign_architecture_needs_its_emulator_registered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, entry: str | None, expected: str | None
) -> None:
    monkeypatch.setattr(images.os, "geteuid", lambda: 0)
    monkeypatch.setattr(images, "HOST_ARCH", "amd64")
    monkeypatch.setattr(images.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    problem = images.preflight(["amd64", "arm64"], _binfmt(tmp_path, entry))
    if expected is None:
        assert problem is None
    else:
        assert problem is not None and expected in problem and "\n" not in problem


def test_what_is_missing_is_named_before_anything_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(images, "HOST_ARCH", "amd64")
    monkeypatch.setattr(images.os, "geteuid", lambda: 1000)
    assert "needs root" in (images.preflight(["amd64"]) or "")
    monkeypatch.setattr(images.os, "geteuid", lambda: 0)
    for tool in ("debootstrap", "chroot", "unshare"):
        monkeypatch.setattr(images.shutil, "which", lambda name, gone=tool: None if name == gone else "/x")
        assert (
            images.preflight(["amd64"]) == f"{tool} not found on PATH: apt-get install {images.TOOLS[tool]}"
        )
    monkeypatch.setattr(images.shutil, "which", lambda name: "/x")
    gone = tmp_path / "unmounted"
    gone.mkdir()
    assert "binfmt_misc is not mounted" in (images.preflight(["arm64"], gone) or "")
    assert images.preflight(["amd64"], gone) is None  # the host's own needs no emulator


def _closure(lock: dict[str, dict[str, object]], name: str, env: dict[str, str]) -> set[str]:
    """A package's locked runtime dependencies whose markers hold on the given platform."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        package = lock[todo.pop()]
        for dep in package.get("dependencies", []):  # type: ignore[attr-defined]
            if "marker" in dep and not Marker(dep["marker"]).evaluate(env):
                continue
            if dep["name"] not in seen:
                seen.add(dep["name"])
                todo.append(dep["name"])
    return seen


def test_what_is_left_out_on_arm64_is_what_the_lock_has_no_wheel_for() -> None:
    lock = {p["name"]: p for p in tomllib.loads((ROOT / "uv.lock").read_text())["package"]}
    env = {
        "sys_platform": "linux",
        "platform_machine": "aarch64",
        "platform_system": "Linux",
        "python_version": "3.11",
        "python_full_version": "3.11.2",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "os_name": "posix",
        "extra": "",
    }

    def installable(package: dict[str, object]) -> bool:
        if "registry" not in package.get("source", {}) or "sdist" in package:  # type: ignore[operator]
            return True  # the workspace's own, or buildable from source
        for wheel in package.get("wheels", []):  # type: ignore[attr-defined]
            tags = wheel["url"].rsplit("/", 1)[1].removesuffix(".whl").split("-")[-3:]
            python, _, plat = tags
            if (plat == "any" or ("linux" in plat and "aarch64" in plat)) and (
                "py3" in python or "cp311" in python or "cp310" in python or python.startswith("cp3")
            ):
                return True
        return False

    left_out: dict[str, str] = {}
    for service in images.SERVICES:
        for name in sorted(_closure(lock, f"dataplane-{service}", env)):
            if not installable(lock[name]):
                left_out[name] = service
    assert left_out == images.NO_WHEEL["arm64"]
