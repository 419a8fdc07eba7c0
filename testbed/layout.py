"""The repository's layout by import name, read from ``pyproject.toml`` as setuptools reads it.

``operator/`` and ``sidecar/`` sit at the top; the shared layers under ``src/schedlock/``
(``[tool.setuptools] package-dir``).  Tests that look at every product module, and the check
that the wheel holds each one under its import name, walk the files through this.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def package_dirs() -> dict[str, Path]:
    """Each package of the distribution and the folder it is built from."""
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapping: dict[str, str] = setuptools["package-dir"]
    found: dict[str, Path] = {}
    for package in setuptools["packages"]:
        if package in mapping:
            found[package] = REPO / mapping[package]
        else:  # below the root mapping: "" = "src"
            found[package] = REPO / mapping[""] / package.replace(".", "/")
    return found


def product_modules() -> dict[str, Path]:
    """Every module of the product: its import name and its file in the repository."""
    modules: dict[str, Path] = {}
    for package, folder in package_dirs().items():
        for path in sorted(folder.glob("*.py")):
            name = package if path.stem == "__init__" else f"{package}.{path.stem}"
            modules[name] = path
    return modules


def wheel_path(name: str) -> str:
    """Where the module ``name`` is in the wheel (and in any install)."""
    path = product_modules()[name]
    parts = name.split(".")
    return "/".join(parts if path.stem != "__init__" else [*parts, "__init__"]) + ".py"
