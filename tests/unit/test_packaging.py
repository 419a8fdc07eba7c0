"""The distribution's shape: import names, the console script, the stdlib name clash."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import schedlock

REPO = Path(__file__).resolve().parents[2]


def test_stdlib_operator_is_not_shadowed() -> None:
    import operator

    assert operator.__file__ is not None
    assert (
        Path(operator.__file__).parent == Path(importlib.import_module("os").__file__ or "").parent
    )
    assert hasattr(operator, "itemgetter")
    # Even a fresh interpreter started at the repo root gets the standard library's module.
    out = subprocess.run(
        [sys.executable, "-c", "import operator; print(operator.__file__)"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert "site-packages" not in out
    assert not out.strip().startswith(str(REPO))


def test_import_names_are_file_paths_under_src() -> None:
    """The one rule a newcomer needs: `schedlock.a.b` is `src/schedlock/a/b.py`."""
    installed = sorted((REPO / "src").rglob("*.py"))
    assert installed, "no modules under src/"
    for path in installed:
        if path.name == "__main__.py":  # importing it runs the CLI
            continue
        parts = path.relative_to(REPO / "src").with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        imported = importlib.import_module(name)
        assert Path(imported.__file__ or "").resolve() == path, name
    import schedlock.operator

    assert schedlock.operator.__name__ == "schedlock.operator"


def test_repo_root_on_sys_path_never_shadows_stdlib() -> None:
    """`python -c`/`-m` from the repo root put it first on sys.path: stdlib must still win."""
    out = subprocess.run(
        [sys.executable, "-c", "import collections, operator; print(operator.__file__)"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    assert Path(out).parent == Path(collections_file()).parent


def collections_file() -> str:
    import os

    return os.__file__


def test_version_and_help() -> None:
    script = str(Path(sys.executable).parent / "schedlock")
    version = subprocess.run(
        [script, "--version"], check=True, capture_output=True, text=True
    ).stdout
    assert version.strip() == f"schedlock {schedlock.__version__}"
    helptext = subprocess.run([script, "--help"], check=True, capture_output=True, text=True).stdout
    assert "usage: schedlock" in helptext
    assert "advisory locks" in helptext
