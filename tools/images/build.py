"""Builds the four service images without a container engine, for amd64 and arm64, as multi-platform
OCI image layouts, and starts one.

    sudo "$(command -v uv)" run python tools/images/build.py build [--out DIR] [--arch amd64,arm64]
    sudo "$(command -v uv)" run python tools/images/build.py smoke [--out DIR] [--service audit-relay]
    sudo "$(command -v uv)" run python tools/images/build.py check [--arch amd64,arm64]

(`sudo uv` alone may not resolve: sudo's secure_path rarely holds ~/.local/bin; as root, plain `uv run`.)

`build` makes, per architecture, one Debian base (`debootstrap --variant=minbase --arch=ARCH` of
bookworm with its python3.11, ca-certificates and the user 10001 the chart runs as; the mirror is
debootstrap's default unless DEBIAN_MIRROR is set), then per service a locked `uv sync --no-dev
--no-editable --package dataplane-<svc>` into /app/.venv, run inside that base under chroot, so the
venv's interpreter, paths and compiled wheels are the image's own. A foreign architecture's base
and sync run under qemu-user-static registered in binfmt_misc (with the F flag, so a chroot needs
no interpreter inside it), with a uv of the same version and that architecture from PyPI. Each
image is two layers — the base, the service's venv — and every ELF file of the venv layer is
checked to be of the image's architecture. OUT/<svc> is an OCI image layout whose `index.json`
names `<tag>`: an image index with one manifest per architecture (`platform: {architecture, os}`),
what `skopeo copy --all` pushes as one multi-arch tag. Layer tars are sorted, with fixed times
and numeric owners: a base layer is the same bytes while its kept base is unchanged; a venv layer
is not yet (the workspace wheels and their RECORDs are rebuilt at each sync). The base root file
systems are kept (--bases, default under /var/cache) and reused while their recipe is unchanged;
the syncs share uv's cache.

`smoke` imports every image's app as uid 10001 on every architecture in the layouts (an
undeclared dependency, or one missing on one architecture, fails there), then unpacks one image
from its layout (checking every digest), starts its entrypoint as uid 10001 in a chroot inside new
mount and PID namespaces (`unshare`), and checks `/healthz` answers 200 and `/readyz` 503 naming
the broker it cannot reach (so the answer is the service's own).

`check` tells in one line what is missing for the given architectures (root, debootstrap, chroot,
unshare, the emulator), as `build` and `smoke` do before they start; exit 0 when nothing is.

A release (.github/workflows/release.yml) pushes each layout with `skopeo copy --all` (README,
"Images"; docs/operations.md, "Mirroring the images")."""

from __future__ import annotations

import argparse
import fcntl
import gzip
import hashlib
import io
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SERVICES = {"query-gateway": 8000, "signaling": 8001, "filter-resolver": 8002, "audit-relay": 8003}
UID = 10001  # the chart's global.runAsUser and the Dockerfiles' USER
SUITE = "bookworm"  # its python3 is 3.11, the lowest Python the project supports
VENV = "/app/.venv"
EPOCH = int(os.environ.get("SOURCE_DATE_EPOCH", "1767225600"))  # no file in a layer is newer
# Inside the base, only what running needs: no documentation, no package lists.
PRUNE = (
    "usr/share/doc",
    "usr/share/man",
    "usr/share/info",
    "usr/share/locale",
    "var/lib/apt/lists",
    "var/cache/apt",
)


# A base made by another version of this recipe is made anew.
def base_id(arch: str) -> str:
    return f"{SUITE} {arch} minbase python3 ca-certificates uid {UID} pruned {','.join(PRUNE)}\n"


MARKER = ".dataplane-base"
# Kept between runs on one machine (a new machine makes them: about 4 minutes for debootstrap of
# amd64, about 3 for arm64 under qemu, measured on this project's 2-core machines).
DEFAULT_BASES = Path("/var/cache/dataplane-images")
# Debian's architecture name -> (the binfmt_misc handler that runs its binaries on another host,
# uv's --python-platform for fetching a uv of that architecture, the ELF e_machine of its binaries)
ARCHES: dict[str, tuple[str, str, int]] = {
    "amd64": ("qemu-x86_64", "x86_64-unknown-linux-gnu", 0x3E),
    "arm64": ("qemu-aarch64", "aarch64-unknown-linux-gnu", 0xB7),
}
HOST_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
BINFMT = Path("/proc/sys/fs/binfmt_misc")
# Packages of the lock published with no wheel for an architecture and no sdist: a sync there
# leaves them out (tests/images/test_oci_layout.py checks this list against uv.lock), and the
# import check in `smoke` proves each app imports without them on that architecture.
NO_WHEEL: dict[str, dict[str, str]] = {
    "arm64": {
        # only linux x86_64 and macOS wheels exist; celine-sdk requires it for its policies
        # engine (celine.sdk.policies), which filter-resolver does not import
        "celine-regorus": "filter-resolver",
    },
}
# What the workspace lock check reads (as the Dockerfiles copy it).
SOURCES = ("pyproject.toml", "uv.lock", "libs", "services", "deploy/local/pyproject.toml")


def log(message: str) -> None:
    print(f"[images {time.strftime('%H:%M:%S')}] {message}", flush=True)


def run(cmd: list[str], **kw: Any) -> None:
    try:
        subprocess.run(cmd, check=True, **kw)
    except FileNotFoundError:
        # preflight() names the tools first; this is for one that vanished since
        raise SystemExit(f"{cmd[0]} not found (needed by tools/images/build.py)") from None
    except subprocess.CalledProcessError as err:
        raise SystemExit(f"{' '.join(cmd[:3])} ... exited {err.returncode}") from None


# ------------------------------------------------------------------ what the host must have

# a tool -> the Debian package that brings it
TOOLS = {"debootstrap": "debootstrap", "chroot": "coreutils", "unshare": "util-linux", "mount": "mount"}


def preflight(arches: list[str], binfmt: Path = BINFMT) -> str | None:
    """What is missing to build or run images of these architectures here, in one line; None if
    nothing is."""
    unknown = [a for a in arches if a not in ARCHES]
    if unknown:
        return f"unknown architecture {', '.join(unknown)} (known: {', '.join(ARCHES)})"
    if os.geteuid() != 0:
        return (
            "tools/images/build.py needs root (debootstrap, chroot, unshare): "
            'sudo "$(command -v uv)" run python tools/images/build.py ...'
        )
    for tool, package in TOOLS.items():
        if shutil.which(tool) is None:
            return f"{tool} not found on PATH: apt-get install {package}"
    for arch in arches:
        if arch == HOST_ARCH:
            continue
        handler = ARCHES[arch][0]
        install = f"{arch} on {HOST_ARCH} needs {handler} registered in binfmt_misc"
        if not (binfmt / "status").exists():
            return (
                f"{install}, and binfmt_misc is not mounted: "
                f"mount -t binfmt_misc binfmt_misc {binfmt}; apt-get install qemu-user-static"
            )
        entry = binfmt / handler
        if not entry.exists():
            return (
                f"{install}: apt-get install qemu-user-static (without systemd running, then "
                f"/lib/systemd/systemd-binfmt /usr/lib/binfmt.d/{handler}.conf)"
            )
        lines = entry.read_text().splitlines()
        fields = dict(line.split(" ", 1) for line in lines[1:] if " " in line)
        if not lines or lines[0] != "enabled":
            return f"{install}: {entry} is disabled (echo 1 > {entry})"
        if "F" not in fields.get("flags:", ""):
            # without F the kernel opens the interpreter inside the chroot, where there is none
            return f"{install} with the F flag (fix-binary): {entry} has flags {fields.get('flags:', '')!r}"
        if not Path(fields.get("interpreter", "")).exists():
            return f"{install}: its interpreter {fields.get('interpreter')} is missing"
    return None


def elf_machine(path: Path) -> int | None:
    """The e_machine of an ELF file (little-endian, as both architectures are); None if not ELF."""
    with path.open("rb") as fh:
        head = fh.read(20)
    if len(head) < 20 or head[:4] != b"\x7fELF":
        return None
    return int.from_bytes(head[18:20], "little")


def foreign_elves(root: Path, arch: str) -> list[str]:
    """Every ELF file under root whose machine is not the architecture's (relative paths)."""
    wrong = []
    want = ARCHES[arch][2]
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            path = Path(dirpath) / name
            if path.is_symlink() or not path.is_file():
                continue
            machine = elf_machine(path)
            if machine is not None and machine != want:
                wrong.append(path.relative_to(root).as_posix())
    return sorted(wrong)


def app_version() -> str:
    chart = (ROOT / "deploy" / "helm" / "Chart.yaml").read_text()
    for line in chart.splitlines():
        if line.startswith("appVersion:"):
            return line.split(":", 1)[1].strip().strip("\"'")
    raise SystemExit("deploy/helm/Chart.yaml has no appVersion")


# ------------------------------------------------------------------ the base root file system


def make_base(base: Path, arch: str) -> None:
    marker = base / MARKER
    if (
        (base / "usr" / "bin" / "python3.11").exists()
        and marker.exists()
        and marker.read_text() == base_id(arch)
    ):
        log(f"base {arch}: reusing {base}")
        return
    if base.exists():
        shutil.rmtree(base)
    log(f"base {arch}: debootstrap {SUITE} minbase into {base}")
    cmd = [
        "debootstrap",
        "--variant=minbase",
        f"--arch={arch}",
        "--include=python3,ca-certificates",
        SUITE,
        str(base),
    ]
    if os.environ.get("DEBIAN_MIRROR"):
        cmd.append(os.environ["DEBIAN_MIRROR"])
    run(cmd, stdout=subprocess.DEVNULL)
    run(
        [
            "chroot",
            str(base),
            "useradd",
            "--system",
            "--uid",
            str(UID),
            "--user-group",
            "--no-create-home",
            "--shell",
            "/usr/sbin/nologin",
            "dataplane",
        ]
    )
    for part in PRUNE:
        shutil.rmtree(base / part, ignore_errors=True)
    # debootstrap copied the build host's DNS settings; a runtime mounts its own
    (base / "etc" / "resolv.conf").write_text("")
    marker.write_text(base_id(arch))


def _uv_binary() -> Path:
    """The uv running this script (`uv run` names itself in UV), else the one on PATH: a real
    binary, copied into the base for the sync."""
    found = os.environ.get("UV") or shutil.which("uv")
    if not found:
        raise SystemExit("uv not found: run this with `uv run`")
    return Path(found).resolve()


def uv_for(arch: str, bases: Path) -> Path:
    """A uv binary for the architecture: the running one on the host's, else the same version's
    wheel for that architecture from PyPI (kept beside the bases)."""
    host_uv = _uv_binary()
    if arch == HOST_ARCH:
        return host_uv
    version = subprocess.run(
        [str(host_uv), "--version"], capture_output=True, text=True, check=True
    ).stdout.split()[1]
    target = bases / f"uv-{version}-{arch}"
    binary = target / "bin" / "uv"
    if not binary.exists():
        log(f"uv {version} for {arch}: from PyPI")
        shutil.rmtree(target, ignore_errors=True)
        run(
            [
                str(host_uv),
                "pip",
                "install",
                "--quiet",
                "--no-deps",
                "--only-binary",
                ":all:",
                "--python-platform",
                ARCHES[arch][1],
                "--target",
                str(target),
                f"uv=={version}",
            ]
        )
    if elf_machine(binary) != ARCHES[arch][2]:
        raise SystemExit(f"{binary} is not an {arch} binary")
    return binary


def sync_venv(base: Path, service: str, cache: Path, arch: str, uv: Path) -> None:
    """A locked sync of one service into /app/.venv, run inside the base under chroot (new mount
    namespace: /proc, /dev, the sources and the uv cache are mounted there and vanish with it)."""
    shutil.rmtree(base / "app", ignore_errors=True)
    src = base / "src"
    shutil.rmtree(src, ignore_errors=True)
    for rel in SOURCES:
        target = src / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / rel).is_dir():
            shutil.copytree(
                ROOT / rel, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".venv")
            )
        else:
            shutil.copy2(ROOT / rel, target)
    shutil.copy2(uv, base / "usr" / "local" / "bin" / "uv")
    (base / "uv-cache").mkdir(exist_ok=True)
    # The build host's DNS and trusted CAs (a host behind a TLS-inspecting proxy has its own) are
    # mounted for the sync only: neither ends up in a layer (/tmp goes in empty).
    (base / "etc" / "resolv.conf").touch()
    host_ca = os.environ.get("SSL_CERT_FILE") or "/etc/ssl/certs/ca-certificates.crt"
    (base / "tmp").mkdir(exist_ok=True)
    shutil.copy2(host_ca, base / "tmp" / "build-ca.pem")
    env = " ".join(
        [
            "UV_PYTHON_DOWNLOADS=never",
            "UV_COMPILE_BYTECODE=1",
            "UV_LINK_MODE=copy",
            f"UV_PROJECT_ENVIRONMENT={VENV}",
            "UV_CACHE_DIR=/uv-cache",
            "UV_PYTHON=/usr/bin/python3.11",
            "HOME=/tmp",
            "SSL_CERT_FILE=/tmp/build-ca.pem",
        ]
    )
    leave_out = "".join(f" --no-install-package {name}" for name in NO_WHEEL.get(arch, {}))
    script = (
        f"set -e; mount -t proc proc {base}/proc; mount --rbind /dev {base}/dev; "
        f"mount --bind {cache} {base}/uv-cache; mount --bind /etc/resolv.conf {base}/etc/resolv.conf; "
        f"chroot {base} /bin/sh -c 'cd /src && env {env} uv sync --quiet --locked --no-dev "
        f"--no-editable --package dataplane-{service}{leave_out}'"
    )
    run(["unshare", "--mount", "--propagation", "private", "--fork", "sh", "-c", script])
    shutil.rmtree(src)
    (base / "usr" / "local" / "bin" / "uv").unlink()
    (base / "tmp" / "build-ca.pem").unlink()
    if not (base / VENV.lstrip("/") / "bin" / service).exists():
        raise SystemExit(f"{service} {arch}: the sync made no {VENV}/bin/{service}")
    wrong = foreign_elves(base / "app", arch)
    if wrong:
        raise SystemExit(f"{service} {arch}: {len(wrong)} ELF files of another architecture, e.g. {wrong[0]}")


# ------------------------------------------------------------------ OCI image layout


def _entries(root: Path, include: list[str], exclude: set[str]) -> Iterator[Path]:
    """Every path under the included top-level names, sorted, skipping the excluded (relative) ones."""
    for top in include:
        start = root / top
        if not start.exists() and not start.is_symlink():
            continue
        yield start
        if start.is_dir() and not start.is_symlink():
            for dirpath, dirnames, filenames in os.walk(start):
                rel = Path(dirpath).relative_to(root).as_posix()
                dirnames[:] = sorted(d for d in dirnames if f"{rel}/{d}" not in exclude)
                for name in sorted(dirnames + [f for f in filenames if f"{rel}/{f}" not in exclude]):
                    yield Path(dirpath) / name


def write_layer(root: Path, include: list[str], exclude: set[str], blobs: Path) -> tuple[str, str, int]:
    """A gzip'd tar of `include` (paths under root), sorted, fixed times; (diff_id, digest, size)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in _entries(root, include, exclude):
            info = tar.gettarinfo(str(path), arcname=path.relative_to(root).as_posix())
            info.mtime = min(int(info.mtime), EPOCH)
            info.uname = info.gname = ""
            if info.isreg():
                with path.open("rb") as fh:
                    tar.addfile(info, fh)
            else:
                tar.addfile(info)
    data = raw.getvalue()
    diff_id = "sha256:" + hashlib.sha256(data).hexdigest()
    zipped = gzip.compress(data, compresslevel=6, mtime=0)
    return diff_id, _blob(blobs, zipped), len(zipped)


def _blob(blobs: Path, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    (blobs / digest).write_bytes(data)
    return f"sha256:{digest}"


Layers = list[tuple[str, str, int]]  # (diff_id, digest, size) per layer, bottom first


def _manifest(blobs: Path, service: str, tag: str, arch: str, layers: Layers) -> dict[str, Any]:
    """One architecture's config and manifest, written as blobs; the manifest's descriptor."""
    scripts = tomllib.loads((ROOT / "services" / service / "pyproject.toml").read_text())["project"][
        "scripts"
    ]
    assert service in scripts
    config = {
        "architecture": arch,
        "os": "linux",
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(EPOCH)),
        "config": {
            "User": f"{UID}:{UID}",
            "Entrypoint": [service],
            "Env": [
                f"PATH={VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "PYTHONUNBUFFERED=1",
                "PYTHONDONTWRITEBYTECODE=1",
            ],
            "ExposedPorts": {f"{SERVICES[service]}/tcp": {}},
            "WorkingDir": "/",
            "Labels": {
                "org.opencontainers.image.title": f"dataplane {service}",
                "org.opencontainers.image.version": tag,
            },
        },
        "rootfs": {"type": "layers", "diff_ids": [diff for diff, _, _ in layers]},
        "history": [
            {"created_by": f"debootstrap {SUITE} {arch} minbase + python3"},
            {"created_by": f"uv sync {service}"},
        ],
    }
    config_bytes = json.dumps(config, sort_keys=True).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": _blob(blobs, config_bytes),
            "size": len(config_bytes),
        },
        "layers": [
            {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": digest, "size": size}
            for _, digest, size in layers
        ],
    }
    manifest_bytes = json.dumps(manifest, sort_keys=True).encode()
    return {
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": _blob(blobs, manifest_bytes),
        "size": len(manifest_bytes),
        "platform": {"architecture": arch, "os": "linux"},
    }


def write_image(out: Path, service: str, tag: str, images: dict[str, Layers], base_blobs: Path) -> str:
    """OUT/<service> as an OCI image layout: `index.json` names `tag`, an image index holding one
    manifest per architecture. The index is its own blob (not index.json itself) because a copier
    resolves `oci:DIR:TAG` to the one descriptor so named: two manifests both named TAG in
    index.json would be read as the first one alone. The image index's digest is returned."""
    layout = out / service
    shutil.rmtree(layout, ignore_errors=True)
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    manifests = []
    for arch, layers in sorted(images.items()):
        for _, digest, _ in layers:
            shutil.copy2(base_blobs / digest.split(":", 1)[1], blobs / digest.split(":", 1)[1])
        manifests.append(_manifest(blobs, service, tag, arch, layers))
    image_index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": manifests,
    }
    image_index_bytes = json.dumps(image_index, sort_keys=True).encode()
    digest = _blob(blobs, image_index_bytes)
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.index.v1+json",
                "digest": digest,
                "size": len(image_index_bytes),
                "annotations": {"org.opencontainers.image.ref.name": tag},
            }
        ],
    }
    (layout / "index.json").write_text(json.dumps(index, indent=2) + "\n")
    (layout / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}) + "\n")
    return digest


def build(out: Path, tag: str, bases: Path, cache: Path, arches: list[str]) -> None:
    started = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    images: dict[str, dict[str, Layers]] = {service: {} for service in SERVICES}
    with tempfile.TemporaryDirectory(prefix="dataplane-blobs-") as tmp:
        blobs = Path(tmp)
        for arch in arches:
            t_arch = time.monotonic()
            base = bases / f"{SUITE}-{arch}-rootfs"
            make_base(base, arch)
            # what an interrupted run may have left in the kept base must not reach its layer
            for leftover in ("app", "src", "usr/local/bin/uv", "tmp/build-ca.pem"):
                path = base / leftover
                shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
            uv = uv_for(arch, bases)
            log(f"base {arch} ready after {time.monotonic() - t_arch:.0f} s")
            # /tmp, /run, /proc, /dev and /sys go in empty: mount points (the chart mounts /tmp)
            mounts = ("tmp", "run", "proc", "dev", "sys")
            for mount in mounts:
                (base / mount).mkdir(exist_ok=True)
            top = sorted(p.name for p in base.iterdir() if p.name not in {"app", "src", "uv-cache", MARKER})
            base_layer = write_layer(base, top, set(_children(base, *mounts)), blobs)
            log(f"base layer {arch} {base_layer[1][:19]} {base_layer[2] / 1e6:.1f} MB")
            for service in SERVICES:
                t0 = time.monotonic()
                sync_venv(base, service, cache, arch, uv)
                venv_layer = write_layer(base, ["app"], set(), blobs)
                images[service][arch] = [base_layer, venv_layer]
                size, took = venv_layer[2] / 1e6, time.monotonic() - t0
                left_out = [n for n, svc in NO_WHEEL.get(arch, {}).items() if svc == service]
                note = f", without {', '.join(left_out)} (no {arch} wheel)" if left_out else ""
                log(f"{service} {arch}: {size:.1f} MB venv layer, {took:.0f} s{note}")
            shutil.rmtree(base / "app", ignore_errors=True)
            log(f"{arch}: {len(SERVICES)} images in {time.monotonic() - t_arch:.0f} s")
        for service in SERVICES:
            digest = write_image(out, service, tag, images[service], blobs)
            log(f"{service}: {out / service} {tag} ({', '.join(arches)}) {digest}")
    log(f"built {len(SERVICES)} images for {', '.join(arches)} in {time.monotonic() - started:.0f} s")


def _children(root: Path, *dirs: str) -> Iterator[str]:
    """Everything below the given top-level directories: excluded, so each stays an empty mount point."""
    for d in dirs:
        top = root / d
        if top.is_dir():
            for child in top.iterdir():
                yield f"{d}/{child.name}"


# ------------------------------------------------------------------ smoke: start one image


def _read_blob(layout: Path, digest: str) -> bytes:
    data = (layout / "blobs" / "sha256" / digest.split(":", 1)[1]).read_bytes()
    if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
        raise SystemExit(f"{layout}: blob {digest} does not match its digest")
    return data


def platforms(layout: Path) -> dict[str, str]:
    """The layout's tagged image: architecture -> its manifest's digest."""
    (named,) = json.loads((layout / "index.json").read_text())["manifests"]
    if named["mediaType"] != "application/vnd.oci.image.index.v1+json":
        raise SystemExit(f"{layout}: index.json names a single manifest, not a multi-platform index")
    image_index = json.loads(_read_blob(layout, named["digest"]))
    return {m["platform"]["architecture"]: m["digest"] for m in image_index["manifests"]}


def unpack(layout: Path, dest: Path, arch: str = HOST_ARCH) -> dict[str, Any]:
    """Apply the architecture's layers in order under dest, checking each blob's digest; its config."""
    found = platforms(layout)
    if arch not in found:
        raise SystemExit(f"{layout}: no {arch} image (it has {', '.join(sorted(found))})")
    manifest = json.loads(_read_blob(layout, found[arch]))
    config: dict[str, Any] = json.loads(_read_blob(layout, manifest["config"]["digest"]))
    if config["architecture"] != arch:
        raise SystemExit(f"{layout}: the {arch} manifest's config says {config['architecture']}")
    for layer, diff_id in zip(manifest["layers"], config["rootfs"]["diff_ids"], strict=True):
        data = gzip.decompress(_read_blob(layout, layer["digest"]))
        if "sha256:" + hashlib.sha256(data).hexdigest() != diff_id:
            raise SystemExit(f"{layout}: layer {layer['digest']} does not match its diff_id")
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            tar.extractall(dest, filter="fully_trusted")  # noqa: S202 - our own layers, digests checked
    return config


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:  # noqa: S310 - http://127.0.0.1 only
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def check_imports(out: Path) -> None:
    """Every image imports its whole app as uid 10001, on every architecture it was built for (a
    foreign one under its emulator): a dependency used but not declared (which the workspace's
    shared venv hides), or one left out on an architecture, fails here, not in a cluster."""
    for service in SERVICES:
        for arch in sorted(platforms(out / service)):
            t0 = time.monotonic()
            with tempfile.TemporaryDirectory(prefix="dataplane-imports-") as tmp:
                rootfs = Path(tmp) / "rootfs"
                rootfs.mkdir(mode=0o755)  # the image's /, which uid 10001 must be able to enter
                config = unpack(out / service, rootfs, arch)["config"]
                package = service.replace("-", "_")
                code = f"import {package}.app, {package}.__main__"
                python = ["/usr/bin/env", "-i", *config["Env"], f"{VENV}/bin/python", "-c", code]
                run(["chroot", f"--userspec={config['User']}", str(rootfs), *python])
            log(f"imports: {service} {arch} ({code}) ok in {time.monotonic() - t0:.0f} s")


def smoke(out: Path, service: str, timeout_s: float, arch: str) -> None:
    started = time.monotonic()
    check_imports(out)
    with tempfile.TemporaryDirectory(prefix="dataplane-smoke-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        rootfs.mkdir(mode=0o755)
        config = unpack(out / service, rootfs, arch)["config"]
        port = _free_port()
        dead = _free_port()  # nothing listens there: the broker the service cannot reach
        env = [
            *config["Env"],
            f"HTTP_PORT={port}",
            "HTTP_HOST=127.0.0.1",
            "OTEL_SDK_DISABLED=true",
            f"KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:{dead}",
            f"CONNECTOR_INTERNAL_URL=http://127.0.0.1:{dead}",
        ]
        user = config["User"]
        # new PID and mount namespaces (the host network, so loopback reaches the service)
        cmd = [
            "unshare",
            "--pid",
            "--mount",
            "--fork",
            f"--mount-proc={rootfs}/proc",
            "chroot",
            f"--userspec={user}",
            str(rootfs),
            "/usr/bin/env",
            "-i",
            *env,
            *config["Entrypoint"],
        ]
        log(f"smoke: starting {service} {arch} ({' '.join(config['Entrypoint'])}) as {user} on port {port}")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + timeout_s
            health: tuple[int, str] | None = None
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    health = _get(f"http://127.0.0.1:{port}/healthz")
                    break
                except OSError:
                    time.sleep(0.5)
            if health is None:
                output = proc.stdout.read().decode() if proc.poll() is not None and proc.stdout else ""
                raise SystemExit(
                    f"smoke: {service} never answered /healthz within {timeout_s:.0f} s\n{output}"
                )
            ready = _get(f"http://127.0.0.1:{port}/readyz")
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 15)  # unshare's session: the service in its PID namespace with it
            proc.wait(timeout=30)
        if health[0] != 200:
            raise SystemExit(f"smoke: /healthz answered {health}")
        if ready[0] != 503 or "broker" not in ready[1]:
            raise SystemExit(f"smoke: /readyz answered {ready}, expected 503 naming the broker")
        log(f"smoke: {service} /healthz {health[0]} {health[1]}; /readyz {ready[0]} {ready[1]}")
    log(f"smoke passed in {time.monotonic() - started:.0f} s")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", choices=["build", "smoke", "check"])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "images")
    parser.add_argument("--tag", default=app_version())
    parser.add_argument(
        "--arch",
        default=None,
        help="build/check: architectures, comma-separated (default amd64,arm64); smoke: the one started",
    )
    parser.add_argument(
        "--bases", type=Path, default=DEFAULT_BASES, help="base root file systems, kept between runs"
    )
    parser.add_argument("--cache", type=Path, default=None, help="uv cache of the syncs (default: uv's own)")
    parser.add_argument("--service", default="audit-relay", choices=sorted(SERVICES))
    parser.add_argument("--timeout", type=float, default=60.0, help="smoke: seconds to wait for /healthz")
    args = parser.parse_args(argv)
    if args.command == "smoke":
        started = args.arch or HOST_ARCH
        layouts = [args.out / s for s in SERVICES]
        missing = [str(p) for p in layouts if not (p / "index.json").exists()]
        if missing:
            print(f"no image layout at {missing[0]}: run `build` first", file=sys.stderr)
            return 2
        arches = sorted({a for p in layouts for a in platforms(p)} | {started})
    else:
        arches = [a for a in (args.arch or "amd64,arm64").split(",") if a]
    problem = preflight(arches)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    if args.command == "check":
        print(f"ok: {', '.join(arches)} can be built and run here (host {HOST_ARCH})")
    elif args.command == "build":
        cache = args.cache or Path(
            subprocess.run(
                [str(_uv_binary()), "cache", "dir"], capture_output=True, text=True, check=True
            ).stdout.strip()
        )
        cache.mkdir(parents=True, exist_ok=True)
        args.bases.mkdir(parents=True, exist_ok=True)
        # one build at a time per kept bases: two would sync into the same /app
        with open(args.bases / "build.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            build(args.out, args.tag, args.bases, cache, arches)
    else:
        smoke(args.out, args.service, args.timeout, started)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
