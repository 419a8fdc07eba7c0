"""Installed copies of earlier schedlock releases, built from this repository's git history.

The upgrade test (tests/e2e/test_upgrade.py) runs the oldest release we still support next to
today's code.  :data:`OLDEST_SUPPORTED` names it — the one place to move it forward, on purpose,
when a release stops being supported (docs/operations.md, "Tested upgrade path").

:func:`install` builds a release once per machine into
``${XDG_CACHE_HOME:-~/.cache}/schedlock/releases/<commit>/`` (``SCHEDLOCK_RELEASES_CACHE``
overrides the folder): ``src/`` is ``git archive <commit>`` unpacked, ``venv/`` a virtualenv
with that tree ``pip install``-ed (runtime dependencies only, from the package index), and
``READY`` is written last.  The build runs under an exclusive ``flock`` on ``<commit>.lock`` in
the folder above: a second test process waits for the first one's build instead of racing it,
and a build killed half-way leaves no ``READY`` (the lock dies with its process), so the next
caller starts that folder afresh.  It is built in place rather than in a temporary folder
renamed at the end because a virtualenv is not relocatable: its scripts name their
interpreter by absolute path.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from testbed.procs import output

REPO = Path(__file__).resolve().parents[1]


class ReleaseUnavailable(RuntimeError):
    """The release's commit is not in this clone and could not be fetched (a shallow clone)."""


@dataclass(frozen=True)
class Release:
    """A released commit of this repository, the newest migration its binary knows, and where
    :func:`install` puts it."""

    commit: str
    schema: int

    @property
    def short(self) -> str:
        return self.commit[:7]

    @property
    def root(self) -> Path:
        return cache_root() / self.commit

    @property
    def schedlock(self) -> str:
        """The installed release's ``schedlock`` console script."""
        return str(self.root / "venv" / "bin" / "schedlock")


# The oldest release an installation may upgrade from and roll back to: the version before the
# connection budget and the src layout.  Its binary refuses any schema newer than migration 2;
# its console script is `schedlock`, settings the same SCHEDLOCK_* variables as today's.
OLDEST_SUPPORTED = Release("c8e01988944b094eb398fbf42b56f0275e79f655", schema=2)
# The last release whose sidecars wait for each key's lock on a session per key, before one
# session per sidecar for every key of its target: a rolling update from it mixes both on the
# same keys (tests/e2e/test_upgrade.py).
PER_KEY_SESSIONS = Release("fdf00b3b3c383375d9f27997a934191a77cf345e", schema=12)


def cache_root() -> Path:
    explicit = os.environ.get("SCHEDLOCK_RELEASES_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "schedlock" / "releases"


def _stamp() -> str:
    """What READY records: the commit's build is only valid for the interpreter it was made
    with (the venv links to it), so a changed Python rebuilds."""
    return f"{sys.version_info.major}.{sys.version_info.minor} {sys.base_prefix}"


def _git(*args: str) -> str:
    return output(["git", "-C", str(REPO), *args], f"git {' '.join(args)}")


def _has_commit(commit: str) -> bool:
    result = subprocess.run(
        ["git", "-C", str(REPO), "cat-file", "-e", f"{commit}^{{commit}}"],
        capture_output=True,
        check=False,
    )
    return result.returncode == 0


def ensure_commit(release: Release) -> None:
    """Make sure the release's commit is in this clone: a shallow clone fetches it from origin
    once; without it (no origin, no network) :class:`ReleaseUnavailable` says what to run."""
    if _has_commit(release.commit):
        return
    fetched = subprocess.run(
        ["git", "-C", str(REPO), "fetch", "--quiet", "--no-tags", "origin", release.commit],
        capture_output=True,
        text=True,
        check=False,
    )
    if fetched.returncode == 0 and _has_commit(release.commit):
        return
    shallow = _git("rev-parse", "--is-shallow-repository") == "true"
    why = "this is a shallow clone" if shallow else "it is not in this clone's history"
    said = (fetched.stderr.strip().splitlines() or [f"exit {fetched.returncode}"])[0]
    raise ReleaseUnavailable(
        f"release {release.short} cannot be built: {why} and `git fetch origin {release.commit}` "
        f"failed ({said}); fetch the full history (`git fetch --unshallow`) and run again"
    )


def install(release: Release = OLDEST_SUPPORTED) -> Release:
    """``release``, installed in the cache: built first if it is not there (about a minute)."""
    ready = release.root / "READY"
    if _ready(ready):
        return release
    ensure_commit(release)
    release.root.parent.mkdir(parents=True, exist_ok=True)
    with (release.root.parent / f"{release.commit}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes or the process dies
        if not _ready(ready):  # another process may have built it while we waited
            _build(release)
            ready.write_text(json.dumps({"commit": release.commit, "python": _stamp()}) + "\n")
    return release


def _ready(ready: Path) -> bool:
    try:
        return bool(json.loads(ready.read_text())["python"] == _stamp())
    except (OSError, ValueError, KeyError):
        return False


def _build(release: Release) -> None:
    root = release.root
    shutil.rmtree(root, ignore_errors=True)  # a half-built folder of a build that died
    source = root / "src"
    source.mkdir(parents=True)
    archive = subprocess.Popen(
        ["git", "-C", str(REPO), "archive", "--format=tar", release.commit],
        stdout=subprocess.PIPE,
    )
    assert archive.stdout is not None
    unpacked = subprocess.run(["tar", "-x", "-C", str(source)], stdin=archive.stdout, check=False)
    archive.stdout.close()
    if archive.wait() != 0 or unpacked.returncode != 0:
        raise RuntimeError(f"git archive {release.short} | tar -x failed")
    venv = root / "venv"
    # The base interpreter (the test venv's python links to it), so the release's venv does
    # not depend on the checkout's .venv.
    base = str(Path(sys.executable).resolve())
    output([base, "-m", "venv", str(venv)], f"python -m venv {venv}")
    output(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            str(source),
        ],
        f"pip install of schedlock {release.short}",
    )
