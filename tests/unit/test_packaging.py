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
    assert not out.strip().startswith(str(REPO / "operator"))


def test_folders_map_to_namespaced_import_names() -> None:
    core = importlib.import_module("schedlock.settings")
    sidecar = importlib.import_module("schedlock.sidecar")
    assert Path(core.__file__ or "").resolve().parent == REPO / "core"
    assert Path(sidecar.__file__ or "").resolve().parent == REPO / "sidecar"
    # operator/ is a namespace portion on purpose (see operator/README.md): no __init__.py,
    # and every module in it is importable as schedlock.operator.<module>.
    assert not (REPO / "operator" / "__init__.py").exists()
    for module in sorted((REPO / "operator").glob("*.py")):
        imported = importlib.import_module(f"schedlock.operator.{module.stem}")
        assert Path(imported.__file__ or "").resolve() == module


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
