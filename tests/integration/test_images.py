"""The container images, built here from the project's own Dockerfile by ``hack/images.sh``.

What a node imports is checked as a node would read it: the OCI layout tarball (digests, sizes,
layer diff ids), the name containerd tags it with, the image config (non-root user,
entrypoint), and the files of the merged layers (whiteouts applied): the schedlock command in,
pip and the build's own plumbing out.  The schedlock command then runs from the unpacked
layers with ``chroot`` as uid 65532, no container runtime involved.  Running the images as pods
is the cluster tests' business.

The first run builds the images (base ~1 min, schedlock ~1 min, demo-app ~10 s on two cores;
the script logs each step live); later runs reuse ``~/.cache/schedlock/images`` until an
input changes.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from schedlock import __version__

REPO = Path(__file__).resolve().parents[2]
IMAGES = REPO / "hack" / "images.sh"
BUILD_TIMEOUT = 1800

pytestmark = pytest.mark.timeout(BUILD_TIMEOUT)


def _images(*args: str) -> str:
    done = subprocess.run(
        ["bash", str(IMAGES), *args],
        stdout=subprocess.PIPE,
        text=True,
        check=True,
        timeout=BUILD_TIMEOUT,
    )
    return done.stdout.strip()


@dataclass(frozen=True)
class Built:
    archive: Path
    key: str  # the archive's cache key (its file name: NAME-KEY.oci.tar)
    ref: str | None  # what `hack/images.sh ref` printed, None if the tree changed meanwhile


@pytest.fixture(scope="session")
def built(pytestconfig: pytest.Config) -> dict[str, Built]:
    """Build what is missing or stale, with the script's progress shown live (not captured)."""
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")
    images = {}
    with capture.global_and_fixture_disabled():
        sys.stderr.write(
            "\n==> hack/images.sh path schedlock schedlock-sidecar demo-app "
            "(builds only what changed)\n"
        )
        for name in ("schedlock", "schedlock-sidecar", "demo-app"):
            before = _images("ref", name)
            archive = Path(_images("path", name))
            stable = _images("ref", name) == before
            if not stable:
                # An edit during the build: the archive is the snapshot the script built.
                sys.stderr.write(f"==> {name}: the sources changed during the build\n")
            key = archive.name.removeprefix(f"{name}-").removesuffix(".oci.tar")
            images[name] = Built(archive, key, before if stable else None)
    return images


# --------------------------------------------------------------------------- reading OCI


@dataclass
class Image:
    index: dict[str, Any]
    manifest: dict[str, Any]
    config: dict[str, Any]
    layers: list[Path]  # gzip-compressed tar layers, bottom first


def _blob(layout: Path, digest: str) -> Path:
    algorithm, _, hexdigest = digest.partition(":")
    assert algorithm == "sha256", digest
    return layout / "blobs" / algorithm / hexdigest


def _verified(layout: Path, descriptor: dict[str, Any]) -> bytes:
    data = _blob(layout, descriptor["digest"]).read_bytes()
    assert len(data) == descriptor["size"], descriptor
    assert "sha256:" + hashlib.sha256(data).hexdigest() == descriptor["digest"], descriptor
    return data


def open_archive(archive: Path, into: Path) -> Image:
    """Unpack an OCI archive and check every digest, size and diff id it names."""
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    assert json.loads((into / "oci-layout").read_text()) == {"imageLayoutVersion": "1.0.0"}
    index = json.loads((into / "index.json").read_text())
    assert index["schemaVersion"] == 2
    (entry,) = index["manifests"]
    assert entry["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    manifest = json.loads(_verified(into, entry))
    config = json.loads(_verified(into, manifest["config"]))
    layers = []
    for layer, diff_id in zip(manifest["layers"], config["rootfs"]["diff_ids"], strict=True):
        assert layer["mediaType"] == "application/vnd.oci.image.layer.v1.tar+gzip"
        raw = gzip.decompress(_verified(into, layer))
        # containerd checks this when it unpacks: a wrong diff id fails every pod.
        assert "sha256:" + hashlib.sha256(raw).hexdigest() == diff_id
        layers.append(_blob(into, layer["digest"]))
    return Image(index=index, manifest=manifest, config=config, layers=layers)


def _layer_members(layer: Path) -> Iterator[tuple[str, tarfile.TarInfo]]:
    with tarfile.open(layer, "r:gz") as tar:
        for member in tar:
            name = str(PurePosixPath("/", member.name))
            if name != "/":
                yield name, member


def _whiteout(files: dict[str, Any], name: str) -> bool:
    """Apply ``name`` if it is a whiteout (OCI image spec, layer changesets); True if it was."""
    path = PurePosixPath(name)
    if path.name == ".wh..wh..opq":
        prefix = f"{path.parent}/"
        for lower in [f for f in files if f.startswith(prefix)]:
            del files[lower]
        return True
    if path.name.startswith(".wh."):
        gone = str(path.parent / path.name.removeprefix(".wh."))
        for lower in [f for f in files if f == gone or f.startswith(f"{gone}/")]:
            del files[lower]
        return True
    return False


def merged_files(image: Image) -> dict[str, tarfile.TarInfo]:
    """The image's file system as a runtime assembles it: each layer over the ones below."""
    files: dict[str, tarfile.TarInfo] = {}
    for layer in image.layers:
        members = list(_layer_members(layer))
        # A layer's whiteouts hide the layers below, never the layer's own files.
        added = [(name, m) for name, m in members if not _whiteout(files, name)]
        files.update(added)
    return files


def unpack(image: Image, root: Path) -> None:
    """The merged file system on disk (as root: owners, modes and links as in the image)."""
    root.mkdir()
    for layer in image.layers:
        # Whiteouts first (they hide what the layers below put there), then the layer's files.
        for name, _ in _layer_members(layer):
            path = PurePosixPath(name)
            if path.name == ".wh..wh..opq":
                targets = list((root / path.parent.relative_to("/")).iterdir())
            elif path.name.startswith(".wh."):
                targets = [root / path.parent.relative_to("/") / path.name.removeprefix(".wh.")]
            else:
                continue
            for target in targets:
                if target.is_dir() and not target.is_symlink():
                    shutil.rmtree(target)
                elif target.exists() or target.is_symlink():
                    target.unlink()
        subprocess.run(
            ["tar", "-xzf", str(layer), "-C", str(root), "--exclude=.wh.*", "--numeric-owner"],
            check=True,
        )


def _env(image: Image) -> dict[str, str]:
    return dict(item.split("=", 1) for item in image.config["config"]["Env"])


# --------------------------------------------------------------------------- schedlock


@pytest.fixture(scope="module")
def schedlock_image(built: dict[str, Built], tmp_path_factory: pytest.TempPathFactory) -> Image:
    return open_archive(built["schedlock"].archive, tmp_path_factory.mktemp("schedlock-oci"))


def test_schedlock_archive_names_its_reference(
    built: dict[str, Built], schedlock_image: Image
) -> None:
    image = built["schedlock"]
    assert re.fullmatch(r"[0-9a-f]{12}", image.key)
    ref = f"schedlock.local/schedlock:{__version__}-{image.key}"
    assert image.ref in (ref, None)
    (entry,) = schedlock_image.index["manifests"]
    # ref.name for OCI tools; io.containerd.image.name is what `ctr images import` tags.
    assert entry["annotations"]["org.opencontainers.image.ref.name"] == ref
    assert entry["annotations"]["io.containerd.image.name"] == ref


def test_schedlock_config_is_non_root_with_the_schedlock_entrypoint(schedlock_image: Image) -> None:
    config = schedlock_image.config
    assert (config["os"], config["architecture"]) == ("linux", "amd64")
    assert config["config"]["User"].split(":") == ["65532", "65532"]
    assert config["config"]["Entrypoint"] == ["schedlock"]
    assert _env(schedlock_image)["PATH"].startswith("/opt/schedlock/bin:")
    labels = config["config"]["Labels"]
    assert labels["org.opencontainers.image.version"] == __version__
    assert labels["org.opencontainers.image.title"] == "schedlock"


def test_schedlock_layers_hold_the_command_and_no_pip(schedlock_image: Image) -> None:
    files = merged_files(schedlock_image)
    command = files["/opt/schedlock/bin/schedlock"]
    assert command.isfile() and command.mode & 0o111 == 0o111
    assert "/opt/schedlock/bin/python" in files
    installed = re.compile(r"/(site|dist)-packages/(pip|setuptools|wheel)(-[^/]*\.dist-info)?$")
    leftovers = [
        name
        for name in files
        if re.search(r"/bin/(pip|pip3|pip3\.\d+|wheel)$", name) or installed.search(name)
    ]
    assert leftovers == [], "the runtime image must carry no pip, setuptools or wheel"
    schedlock_pkg = [
        n for n in files if n.startswith("/opt/schedlock/lib/python3.11/site-packages/")
    ]
    assert any(n.endswith("/schedlock/cli/__init__.py") for n in schedlock_pkg)
    # The build's mount points (buildah leaves them empty in the layer; hack/images.sh drops
    # them) and the sources never reach the image.
    for plumbing in ("/etc/pip.conf", "/run/host-ca.crt", "/etc/hosts", "/etc/resolv.conf"):
        assert plumbing not in files
    assert not [n for n in files if n.startswith(("/src/", "/wheels/"))]


def run_from_layers(image: Image, root: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Unpack ``image`` into ``root``; a runner of its ``schedlock`` there, as uid 65532."""
    unpack(image, root)

    def schedlock(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["chroot", "--userspec=65532:65532", str(root), "schedlock", *args],
            env=_env(image),
            cwd="/",
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )

    return schedlock


@pytest.mark.skipif(os.geteuid() != 0, reason="unpacking an image with its owners needs root")
def test_schedlock_runs_from_the_layers_as_uid_65532(
    schedlock_image: Image, tmp_path: Path
) -> None:
    run = run_from_layers(schedlock_image, tmp_path / "rootfs")

    def schedlock(*args: str) -> str:
        done = run(*args)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    assert schedlock("--version").strip() == f"schedlock {__version__}"
    assert "SCHEDLOCK_DATABASE_URL" in schedlock("sidecar", "--help")
    assert "SCHEDLOCK_WEBHOOK_CERT_FILE" in schedlock("operator", "--help")


# --------------------------------------------------------------------------- schedlock-sidecar


@pytest.fixture(scope="module")
def sidecar_image(built: dict[str, Built], tmp_path_factory: pytest.TempPathFactory) -> Image:
    return open_archive(
        built["schedlock-sidecar"].archive, tmp_path_factory.mktemp("schedlock-sidecar-oci")
    )


def test_sidecar_image_is_the_dockerfiles_sidecar_target(
    built: dict[str, Built], sidecar_image: Image
) -> None:
    image = built["schedlock-sidecar"]
    ref = f"schedlock.local/schedlock-sidecar:{__version__}-{image.key}"
    assert image.ref in (ref, None)
    (entry,) = sidecar_image.index["manifests"]
    assert entry["annotations"]["io.containerd.image.name"] == ref
    config = sidecar_image.config["config"]
    assert config["User"].split(":") == ["65532", "65532"]
    assert config["Entrypoint"] == ["schedlock"]
    assert config["Labels"]["org.opencontainers.image.title"] == "schedlock-sidecar"


def test_sidecar_image_holds_no_operator_dependencies(sidecar_image: Image) -> None:
    """Only what `schedlock sidecar` imports: no kopf, no Kubernetes client, no aiohttp, no pip,
    no Prometheus client (the sidecar writes its metrics text itself)."""
    site = "/opt/schedlock/lib/python3.11/site-packages/"
    packages = {
        n.removeprefix(site).split("/")[0].split("-")[0].lower()
        for n in merged_files(sidecar_image)
        if n.startswith(site) and n.endswith(".dist-info")
    }
    assert {"schedlock", "psycopg", "h11"} <= packages
    unwanted = {"kopf", "kubernetes", "aiohttp", "prometheus_client", "pip", "setuptools", "wheel"}
    assert not packages & unwanted, packages


@pytest.mark.skipif(os.geteuid() != 0, reason="unpacking an image with its owners needs root")
def test_sidecar_image_runs_the_sidecar_and_refuses_the_operator(
    sidecar_image: Image, tmp_path: Path
) -> None:
    schedlock = run_from_layers(sidecar_image, tmp_path / "rootfs")
    assert "SCHEDLOCK_DATABASE_URL" in schedlock("sidecar", "--help").stdout
    refused = schedlock("operator")
    assert refused.returncode == 2 and "schedlock[operator]" in refused.stderr, refused


# --------------------------------------------------------------------------- demo app


def test_demo_app_image(built: dict[str, Built], tmp_path: Path) -> None:
    image = open_archive(built["demo-app"].archive, tmp_path / "oci")
    ref = f"schedlock.local/demo-app:{built['demo-app'].key}"
    assert built["demo-app"].ref in (ref, None)
    (entry,) = image.index["manifests"]
    assert entry["annotations"]["org.opencontainers.image.ref.name"] == ref
    assert entry["annotations"]["io.containerd.image.name"] == ref
    config = image.config["config"]
    assert config["User"].split(":") == ["65532", "65532"]
    assert config["Entrypoint"] == ["python", "/app/app.py"]
    assert _env(image)["PORT"] == "8080"
    files = merged_files(image)
    # The image holds exactly the app the tests import (the cache key is its content).
    with tarfile.open(image.layers[-1], "r:gz") as tar:
        member = tar.extractfile("app/app.py")
        assert member is not None
        assert member.read() == (REPO / "examples" / "demo-app" / "app.py").read_bytes()
    assert files["/usr/local/bin/python"].issym()


def test_demo_app_containerfile_passes_hadolint() -> None:
    hadolint = Path(sys.executable).parent / "hadolint"
    containerfile = REPO / "examples" / "demo-app" / "Containerfile"
    result = subprocess.run(
        [str(hadolint), str(containerfile)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_run_step_leaves_the_host_as_it_was() -> None:
    """buildah's RUN steps set up the CNI library, whose default is the host's /etc/cni/net.d
    (it left a cni.lock there, on every machine that built the images): the builds point it
    at the cache instead."""
    before = Path("/etc/cni").exists()
    _images("run-step")
    assert Path("/etc/cni").exists() == before, "a RUN step created /etc/cni on the host"
