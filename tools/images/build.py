"""Builds the four service images without a container engine, as OCI image layouts, and starts one.

    sudo uv run python tools/images/build.py build [--out build/images] [--tag TAG] [--base DIR]
    sudo uv run python tools/images/build.py smoke [--out build/images] [--service audit-relay]

`build` makes one Debian base (`debootstrap --variant=minbase` of bookworm with its python3.11,
ca-certificates and the user 10001 the chart runs as; the mirror is debootstrap's default unless
DEBIAN_MIRROR is set), then per service a locked `uv sync --no-dev --no-editable --package
dataplane-<svc>` into /app/.venv, run inside that base under chroot, so the venv's interpreter and
paths are the image's own. Each image is two layers — the shared base, the service's venv — and is
written as an OCI image layout under OUT/<svc> (`index.json` names it `<tag>`), what the
Dockerfiles build, without Docker. Layer tars are sorted, with fixed times and numeric owners:
the base layer is the same bytes while the kept base is unchanged; a venv layer is not yet (the
workspace wheels and their RECORDs are rebuilt at each sync). The base root file system is kept
(--base, default under /var/cache) and reused while its recipe is unchanged; the syncs share uv's
cache.

`smoke` imports every image's app as uid 10001 (an undeclared dependency fails there), then
unpacks one image from its layout (checking every digest), starts its entrypoint as uid
10001 in a chroot inside new mount and PID namespaces (`unshare`), and checks `/healthz` answers
200 and `/readyz` 503 naming the broker it cannot reach (so the answer is the service's own).

Root is needed (debootstrap, chroot, unshare). A release pushes the layouts with any OCI copier,
e.g. `skopeo copy oci:build/images/query-gateway:TAG docker://REGISTRY/dataplane/query-gateway:TAG`
(README, "Images")."""

from __future__ import annotations

import argparse
import fcntl
import gzip
import hashlib
import io
import json
import os
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
BASE_ID = f"{SUITE} minbase python3 ca-certificates uid {UID} pruned {','.join(PRUNE)}\n"
MARKER = ".dataplane-base"
# Kept between runs on one machine (a new machine makes them: about 4 minutes for debootstrap).
DEFAULT_BASE = Path("/var/cache/dataplane-images/bookworm-rootfs")
# What the workspace lock check reads (as the Dockerfiles copy it).
SOURCES = ("pyproject.toml", "uv.lock", "libs", "services", "deploy/local/pyproject.toml")


def log(message: str) -> None:
    print(f"[images {time.strftime('%H:%M:%S')}] {message}", flush=True)


def run(cmd: list[str], **kw: Any) -> None:
    subprocess.run(cmd, check=True, **kw)


def app_version() -> str:
    chart = (ROOT / "deploy" / "helm" / "Chart.yaml").read_text()
    for line in chart.splitlines():
        if line.startswith("appVersion:"):
            return line.split(":", 1)[1].strip().strip("\"'")
    raise SystemExit("deploy/helm/Chart.yaml has no appVersion")


# ------------------------------------------------------------------ the base root file system


def make_base(base: Path) -> None:
    marker = base / MARKER
    if (base / "usr" / "bin" / "python3.11").exists() and marker.exists() and marker.read_text() == BASE_ID:
        log(f"base: reusing {base}")
        return
    if base.exists():
        shutil.rmtree(base)
    log(f"base: debootstrap {SUITE} minbase into {base}")
    cmd = ["debootstrap", "--variant=minbase", "--include=python3,ca-certificates", SUITE, str(base)]
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
    marker.write_text(BASE_ID)


def _uv_binary() -> Path:
    """The uv running this script (`uv run` names itself in UV), else the one on PATH: a real
    binary, copied into the base for the sync."""
    found = os.environ.get("UV") or shutil.which("uv")
    if not found:
        raise SystemExit("uv not found: run this with `uv run`")
    return Path(found).resolve()


def sync_venv(base: Path, service: str, cache: Path) -> None:
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
    shutil.copy2(_uv_binary(), base / "usr" / "local" / "bin" / "uv")
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
    script = (
        f"set -e; mount -t proc proc {base}/proc; mount --rbind /dev {base}/dev; "
        f"mount --bind {cache} {base}/uv-cache; mount --bind /etc/resolv.conf {base}/etc/resolv.conf; "
        f"chroot {base} /bin/sh -c 'cd /src && env {env} uv sync --quiet --locked --no-dev "
        f"--no-editable --package dataplane-{service}'"
    )
    run(["unshare", "--mount", "--propagation", "private", "--fork", "sh", "-c", script])
    shutil.rmtree(src)
    (base / "usr" / "local" / "bin" / "uv").unlink()
    (base / "tmp" / "build-ca.pem").unlink()
    if not (base / VENV.lstrip("/") / "bin" / service).exists():
        raise SystemExit(f"{service}: the sync made no {VENV}/bin/{service}")


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


def write_image(
    out: Path, service: str, tag: str, layers: list[tuple[str, str, int]], base_blobs: Path
) -> None:
    layout = out / service
    shutil.rmtree(layout, ignore_errors=True)
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    for _, digest, _ in layers:
        shutil.copy2(base_blobs / digest.split(":", 1)[1], blobs / digest.split(":", 1)[1])
    scripts = tomllib.loads((ROOT / "services" / service / "pyproject.toml").read_text())["project"][
        "scripts"
    ]
    assert service in scripts
    config = {
        "architecture": "amd64",
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
            {"created_by": f"debootstrap {SUITE} minbase + python3"},
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
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": _blob(blobs, manifest_bytes),
                "size": len(manifest_bytes),
                "annotations": {"org.opencontainers.image.ref.name": tag},
            }
        ],
    }
    (layout / "index.json").write_text(json.dumps(index, indent=2) + "\n")
    (layout / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}) + "\n")


def build(out: Path, tag: str, base: Path, cache: Path) -> None:
    started = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    make_base(base)
    # what an interrupted run may have left in the kept base must not reach its layer
    for leftover in ("app", "src", "usr/local/bin/uv", "tmp/build-ca.pem"):
        path = base / leftover
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    log(f"base ready after {time.monotonic() - started:.0f} s")
    with tempfile.TemporaryDirectory(prefix="dataplane-blobs-") as tmp:
        blobs = Path(tmp)
        # /tmp, /run, /proc, /dev and /sys go in empty: mount points (the chart mounts /tmp)
        mounts = ("tmp", "run", "proc", "dev", "sys")
        for mount in mounts:
            (base / mount).mkdir(exist_ok=True)
        top = sorted(p.name for p in base.iterdir() if p.name not in {"app", "src", "uv-cache", MARKER})
        base_layer = write_layer(base, top, set(_children(base, *mounts)), blobs)
        log(f"base layer {base_layer[1][:19]} {base_layer[2] / 1e6:.1f} MB")
        for service in SERVICES:
            t0 = time.monotonic()
            sync_venv(base, service, cache)
            venv_layer = write_layer(base, ["app"], set(), blobs)
            write_image(out, service, tag, [base_layer, venv_layer], blobs)
            size, took = venv_layer[2] / 1e6, time.monotonic() - t0
            log(f"{service}: {out / service} ({size:.1f} MB venv layer, {took:.0f} s)")
        shutil.rmtree(base / "app", ignore_errors=True)
    log(f"built {len(SERVICES)} images in {time.monotonic() - started:.0f} s")


def _children(root: Path, *dirs: str) -> Iterator[str]:
    """Everything below the given top-level directories: excluded, so each stays an empty mount point."""
    for d in dirs:
        top = root / d
        if top.is_dir():
            for child in top.iterdir():
                yield f"{d}/{child.name}"


# ------------------------------------------------------------------ smoke: start one image


def unpack(layout: Path, dest: Path) -> dict[str, Any]:
    """Apply the image's layers in order under dest, checking each blob's digest; its config."""

    def blob(digest: str) -> bytes:
        data = (layout / "blobs" / "sha256" / digest.split(":", 1)[1]).read_bytes()
        if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
            raise SystemExit(f"{layout}: blob {digest} does not match its digest")
        return data

    index = json.loads((layout / "index.json").read_text())
    manifest = json.loads(blob(index["manifests"][0]["digest"]))
    config: dict[str, Any] = json.loads(blob(manifest["config"]["digest"]))
    for layer, diff_id in zip(manifest["layers"], config["rootfs"]["diff_ids"], strict=True):
        data = gzip.decompress(blob(layer["digest"]))
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
    """Every image imports its whole app as uid 10001: a dependency used but not declared (which
    the workspace's shared venv hides) fails here, not in a cluster."""
    for service in SERVICES:
        with tempfile.TemporaryDirectory(prefix="dataplane-imports-") as tmp:
            rootfs = Path(tmp) / "rootfs"
            rootfs.mkdir(mode=0o755)  # the image's /, which uid 10001 must be able to enter
            config = unpack(out / service, rootfs)["config"]
            package = service.replace("-", "_")
            code = f"import {package}.app, {package}.__main__"
            python = ["/usr/bin/env", "-i", *config["Env"], f"{VENV}/bin/python", "-c", code]
            run(["chroot", f"--userspec={config['User']}", str(rootfs), *python])
            log(f"imports: {service} ({code}) ok")


def smoke(out: Path, service: str, timeout_s: float) -> None:
    started = time.monotonic()
    check_imports(out)
    with tempfile.TemporaryDirectory(prefix="dataplane-smoke-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        rootfs.mkdir(mode=0o755)
        config = unpack(out / service, rootfs)["config"]
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
        log(f"smoke: starting {service} ({' '.join(config['Entrypoint'])}) as {user} on port {port}")
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
    parser.add_argument("command", choices=["build", "smoke"])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "images")
    parser.add_argument("--tag", default=app_version())
    parser.add_argument(
        "--base", type=Path, default=DEFAULT_BASE, help="base root file system, kept between runs"
    )
    parser.add_argument("--cache", type=Path, default=None, help="uv cache of the syncs (default: uv's own)")
    parser.add_argument("--service", default="audit-relay", choices=sorted(SERVICES))
    parser.add_argument("--timeout", type=float, default=60.0, help="smoke: seconds to wait for /healthz")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("tools/images/build.py needs root (debootstrap, chroot, unshare)", file=sys.stderr)
        return 2
    if args.command == "build":
        cache = args.cache or Path(
            subprocess.run(
                [str(_uv_binary()), "cache", "dir"], capture_output=True, text=True, check=True
            ).stdout.strip()
        )
        cache.mkdir(parents=True, exist_ok=True)
        args.base.parent.mkdir(parents=True, exist_ok=True)
        # one build at a time per kept base: two would sync into the same /app
        with open(args.base.with_name(args.base.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            build(args.out, args.tag, args.base, cache)
    else:
        smoke(args.out, args.service, args.timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
