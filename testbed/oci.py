"""OCI image-layout archives for the test node, built here from source instead of pulled.

What this module guarantees:

- **Deterministic.** An archive is a function of its inputs only: tar entries sorted, owners
  and mtimes zeroed, no gzip (its header holds a timestamp). The same files give byte-identical
  layers, configs and manifests, hence the same digests.
- **Cached by content.** Archives live under ``image_cache_dir()`` named by a hash of their
  inputs (the files' bytes, modes, entrypoint); the image tag is that hash, so a changed binary
  is a new image for containerd too. Files are written under a temporary name and renamed, so
  a crashed build never leaves a truncated archive under the final name.
- **Importable as is.** One uncompressed tar layer, an image config, a manifest and an
  ``index.json`` whose manifest descriptor carries ``io.containerd.image.name`` (and the OCI
  ``ref.name``), which is what ``ctr -n k8s.io images import`` tags the image with.

The node's infrastructure images are recipes here: ``pause_image()`` (``hack/images/pause.c``
compiled with ``gcc -static``), ``coredns_image()`` (the static CoreDNS binary that
``hack/tools.sh`` builds) and ``probe_image()`` (``hack/node/probe``, a static Go binary the
cluster tests run in pods).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "REGISTRY",
    "Image",
    "ImageBuildError",
    "ImageFile",
    "coredns_image",
    "image_cache_dir",
    "oci_archive",
    "pause_image",
    "probe_image",
]

REPO_ROOT = Path(__file__).resolve().parents[1]
PAUSE_SOURCE = REPO_ROOT / "hack" / "images" / "pause.c"
PROBE_SOURCE = REPO_ROOT / "hack" / "node" / "probe"
# A registry host nobody serves: the dot makes containerd keep the name as is (no docker.io/
# prefix), and a pull of it could never reach anything.
REGISTRY = "schedlock.test"
_TAG_LENGTH = 16
_BUILD_TIMEOUT_SECONDS = 600

_MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar"
_MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
_MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


class ImageBuildError(RuntimeError):
    """A compiler failed or is missing; the message names it and carries its output."""


@dataclass(frozen=True)
class ImageFile:
    """One regular file of an image's single layer."""

    path: str
    """Path inside the image, relative to / (``"pause"``, ``"etc/passwd"``)."""
    data: bytes
    mode: int = 0o755


@dataclass(frozen=True)
class Image:
    """An image built here: the reference pods use and the archive containerd imports."""

    ref: str
    archive: Path


def image_cache_dir() -> Path:
    """``${XDG_CACHE_HOME:-~/.cache}/schedlock/images`` (shared with ``hack/images.sh``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "schedlock" / "images"


# --------------------------------------------------------------------------- archives


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _tar(entries: Sequence[tuple[str, bytes, int]]) -> bytes:
    """A tar of (name, data, mode) with parent directories, sorted, owners and mtimes zeroed."""
    names = {name for name, _, _ in entries}
    directories = sorted(
        {str(parent) for name in names for parent in Path(name).parents if str(parent) != "."}
    )
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for directory in directories:
            info = tarfile.TarInfo(directory)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for name, data, mode in sorted(entries):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", delete=False) as f:
        f.write(data)
    os.chmod(f.name, 0o644)  # readable like any cache file (NamedTemporaryFile makes 0600)
    os.replace(f.name, path)


def oci_archive(
    name: str,
    files: Sequence[ImageFile],
    *,
    entrypoint: Sequence[str],
    cmd: Sequence[str] = (),
    cache_dir: Path | None = None,
) -> Image:
    """Write (or find in the cache) the OCI layout tarball of a one-layer image.

    The image is ``schedlock.test/NAME:<hash of the inputs>``.
    """
    recipe = hashlib.sha256(
        _canonical_json(
            {
                "name": name,
                "entrypoint": list(entrypoint),
                "cmd": list(cmd),
                "files": [
                    [f.path, f.mode, hashlib.sha256(f.data).hexdigest()]
                    for f in sorted(files, key=lambda f: f.path)
                ],
            }
        )
    ).hexdigest()
    tag = recipe[:_TAG_LENGTH]
    ref = f"{REGISTRY}/{name}:{tag}"
    archive = (cache_dir or image_cache_dir()) / f"{name}-{tag}.oci.tar"
    if archive.is_file():
        return Image(ref, archive)

    layer = _tar([(f.path, f.data, f.mode) for f in files])
    config = _canonical_json(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": list(entrypoint), "Cmd": list(cmd) or None},
            "rootfs": {"type": "layers", "diff_ids": [_digest(layer)]},
        }
    )
    manifest = _canonical_json(
        {
            "schemaVersion": 2,
            "mediaType": _MEDIA_MANIFEST,
            "config": {"mediaType": _MEDIA_CONFIG, "digest": _digest(config), "size": len(config)},
            "layers": [{"mediaType": _MEDIA_LAYER, "digest": _digest(layer), "size": len(layer)}],
        }
    )
    index = _canonical_json(
        {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": _MEDIA_MANIFEST,
                    "digest": _digest(manifest),
                    "size": len(manifest),
                    "platform": {"architecture": "amd64", "os": "linux"},
                    "annotations": {
                        "io.containerd.image.name": ref,
                        "org.opencontainers.image.ref.name": tag,
                    },
                }
            ],
        }
    )
    blobs = [
        (f"blobs/sha256/{_digest(blob).removeprefix('sha256:')}", blob, 0o644)
        for blob in (layer, config, manifest)
    ]
    layout = _canonical_json({"imageLayoutVersion": "1.0.0"})
    entries = [*blobs, ("index.json", index, 0o644), ("oci-layout", layout, 0o644)]
    _write_atomically(archive, _tar(entries))
    return Image(ref, archive)


# --------------------------------------------------------------------------- recipes


def _run_build(command: Sequence[str], *, cwd: Path, env: dict[str, str] | None = None) -> None:
    if shutil.which(command[0]) is None:
        raise ImageBuildError(
            f"{command[0]} is needed to build the test node's images and is not installed"
        )
    result = subprocess.run(
        command,
        cwd=cwd,
        env=env,
        # one stream: a failed build's messages in the order it printed them
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
        timeout=_BUILD_TIMEOUT_SECONDS,
    )
    if result.returncode != 0:
        raise ImageBuildError(
            f"`{' '.join(command)}` failed ({result.returncode}):\n{result.stdout}"
        )


def _compiled(kind: str, source_key: bytes, build: Callable[[Path], None]) -> bytes:
    """Run BUILD(output_path) once per source hash and keep the binary next to the archives.

    Compilers are not byte-for-byte reproducible across versions, so the binary, not only the
    source, is cached: the image tag then stays stable for as long as the source does.
    """
    key = hashlib.sha256(source_key).hexdigest()[:_TAG_LENGTH]
    binary = image_cache_dir() / "build" / f"{kind}-{key}"
    if not binary.is_file():
        binary.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=binary.parent) as tmp:
            output = Path(tmp) / kind
            build(output)
            os.replace(output, binary)
    return binary.read_bytes()


def pause_image() -> Image:
    """The sandbox image: ``hack/images/pause.c`` compiled static, as ``/pause``."""
    source = PAUSE_SOURCE.read_bytes()

    def build(output: Path) -> None:
        _run_build(
            ["gcc", "-static", "-O2", "-s", "-o", str(output), str(PAUSE_SOURCE)], cwd=output.parent
        )

    binary = _compiled("pause", source, build)
    return oci_archive("pause", [ImageFile("pause", binary)], entrypoint=["/pause"])


def coredns_image(coredns_binary: Path) -> Image:
    """CoreDNS as ``/coredns``, from the static binary ``hack/tools.sh ensure coredns`` built."""
    binary = coredns_binary.read_bytes()
    return oci_archive("coredns", [ImageFile("coredns", binary)], entrypoint=["/coredns"])


def probe_image() -> Image:
    """``hack/node/probe`` as ``/probe`` (entrypoint; no arguments serves HTTP on :8080)."""
    sources = sorted(p for p in PROBE_SOURCE.iterdir() if p.is_file())
    source_key = b"".join(p.name.encode() + b"\0" + p.read_bytes() for p in sources)

    def build(output: Path) -> None:
        # CGO off: a static binary using Go's own resolver, which reads the pod's resolv.conf.
        env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-mod=mod", "GOTOOLCHAIN": "local"}
        command = ["go", "build", "-trimpath", "-ldflags=-s -w -buildid=", "-o", str(output), "."]
        _run_build(command, cwd=PROBE_SOURCE, env=env)

    binary = _compiled("probe", source_key, build)
    return oci_archive("probe", [ImageFile("probe", binary)], entrypoint=["/probe"])
