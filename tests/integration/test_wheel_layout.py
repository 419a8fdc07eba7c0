"""The built wheel is the import layout: every product file under its import name, and the
import contracts kept when the product is imported from the wheel itself."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from testbed.layout import REPO, package_dirs, product_modules, wheel_path


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Built from a copy of what the Dockerfile copies, as the image builds it: an in-tree build
    # would leave build/lib behind, whose stale files a later build would pack.
    out, tree = tmp_path_factory.mktemp("wheel"), tmp_path_factory.mktemp("tree")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, tree / name)
    for name in sorted({folder.relative_to(REPO).parts[0] for folder in package_dirs().values()}):
        ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
        shutil.copytree(REPO / name, tree / name, ignore=ignore)
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"),
            *("--disable-pip-version-check", "--wheel-dir", str(out), str(tree)),
        ],
        check=True,
        capture_output=True,
        cwd=out,
    )
    (built,) = out.glob("schedlock-*.whl")
    return built


def test_the_wheel_holds_every_module_under_its_import_name(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        modules = {name for name in names if name.endswith(".py")}
        assert modules == {wheel_path(name) for name in product_modules()}
        for name, path in product_modules().items():
            assert archive.read(wheel_path(name)) == path.read_bytes(), name
    # Data the store reads at run time travels with it.
    assert any(n.startswith("schedlock/store/migrations/") and n.endswith(".sql") for n in names)
    assert any(n.startswith("schedlock/store/queries/") and n.endswith(".sql") for n in names)
    assert "schedlock/py.typed" in names


def test_the_import_contracts_hold_over_the_wheel(wheel: Path, tmp_path: Path) -> None:
    """import-linter run at the root with the unpacked wheel first on sys.path: the contracts
    are judged on the layout users install, not on the folders."""
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    probe = subprocess.run(
        [sys.executable, "-c", "import schedlock.operator.crd as m; print(m.__file__)"],
        env={**os.environ, "PYTHONPATH": str(site)},
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    )
    assert Path(probe.stdout.strip()).is_relative_to(site)
    linted = subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports"), "--no-cache"],
        env={**os.environ, "PYTHONPATH": str(site)},
        cwd=REPO,
        check=False,
        capture_output=True,
        text=True,
    )
    assert linted.returncode == 0, linted.stdout + linted.stderr
    assert "0 broken" in linted.stdout
