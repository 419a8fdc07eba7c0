"""The distribution's shape: import names, the console script, the stdlib name clash."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import schedlock
from testbed.layout import REPO, product_modules


def python_at_repo_root(code: str, *flags: str) -> str:
    """What a fresh interpreter started at the repo root prints (the root is first on sys.path)."""
    return subprocess.run(
        [sys.executable, *flags, "-c", code], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout.strip()


STDLIB = Path(importlib.import_module("os").__file__ or "").parent
USES_OPERATOR = "import operator, collections, functools; print(operator.__file__); "


@pytest.mark.parametrize(
    "flags",
    [
        pytest.param((), id="python -c at the root"),
        pytest.param(("-S",), id="python -S -c at the root"),
    ],
)
def test_stdlib_operator_is_not_shadowed_by_the_top_level_folder(flags: tuple[str, ...]) -> None:
    """`python -c`/`-m` from the repo root: the standard library's `operator` still wins."""
    printed = python_at_repo_root(
        USES_OPERATOR + "print(operator.itemgetter(1)('ab'), collections.OrderedDict.__name__)",
        *flags,
    ).splitlines()
    assert Path(printed[0]).parent == STDLIB
    assert printed[1] == "b OrderedDict"


def test_the_operator_package_is_only_ever_schedlock_operator() -> None:
    import operator

    assert Path(operator.__file__ or "").parent == STDLIB
    assert python_at_repo_root(
        "import pathlib, schedlock.operator as o; print(pathlib.Path(o.__file__).resolve())"
    ) == str(REPO / "operator" / "__init__.py")


def test_import_names_are_the_layouts_files() -> None:
    """`operator/x.py` is `schedlock.operator.x`, `sidecar/x.py` is `schedlock.sidecar.x`,
    `src/schedlock/a/b.py` is `schedlock.a.b`; every Python file there is a module."""
    modules = product_modules()
    on_disk = {
        path
        for root in (REPO / "operator", REPO / "sidecar", REPO / "src")
        for path in root.rglob("*.py")
    }
    assert on_disk == set(modules.values()), "a Python file outside the packages pyproject names"
    for name, path in modules.items():
        if name == "schedlock.__main__":  # importing it runs the CLI
            continue
        imported = importlib.import_module(name)
        assert Path(imported.__file__ or "").resolve() == path, name


def test_version_and_help() -> None:
    script = str(Path(sys.executable).parent / "schedlock")
    version = subprocess.run(
        [script, "--version"], check=True, capture_output=True, text=True
    ).stdout
    assert version.strip() == f"schedlock {schedlock.__version__}"
    helptext = subprocess.run([script, "--help"], check=True, capture_output=True, text=True).stdout
    assert "usage: schedlock" in helptext
    assert "advisory locks" in helptext


def test_operator_dependencies_are_an_extra() -> None:
    """kopf and the Kubernetes client come with `schedlock[operator]` only: the sidecar's
    image installs the plain distribution, which every other command runs on."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = [dep.split("~")[0].split(">")[0].split("[")[0] for dep in project["dependencies"]]
    assert not {"kopf", "kubernetes"} & set(names)
    extra = project["optional-dependencies"]["operator"]
    assert sorted(dep.split("~")[0].split(">")[0] for dep in extra) == ["kopf", "kubernetes"]
    assert "schedlock[operator]" in project["optional-dependencies"]["dev"]


def test_operator_without_its_extra_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.util

    from schedlock.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,  # what schedlock.operator.command asks whether kopf is installed
        "find_spec",
        lambda name, *a: None if name == "kopf" else real(name, *a),
    )
    assert main(["operator"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "needs kopf" in err and "pip install 'schedlock[operator]'" in err


# What running the sidecar must not import: the operator's dependencies and modules, the admin
# commands, the manifests' YAML, and what only other commands use: the connection pool (a
# sidecar's admin verbs take a connection each) and uuid (the CLI's row uids).  Each costs RSS in
# every pod (docs/performance.md, `footprint`).
NOT_IN_THE_SIDECAR = (
    "kopf",
    "kubernetes",
    "yaml",
    "schedlock.operator",
    "schedlock.cli.admin",
    "psycopg_pool",
    "uuid",
)


def test_the_sidecar_command_imports_nothing_of_the_operator() -> None:
    loaded = (
        python_at_repo_root(
            "import sys\n"
            "from schedlock.cli import main\n"
            "try:\n"
            "    main(['sidecar', '--help'])\n"
            "except SystemExit:\n"
            "    pass\n"
            "import schedlock.sidecar.process, schedlock.store.postgres\n"
            "print(' '.join(sorted(sys.modules)))"
        )
        .splitlines()[-1]
        .split()
    )
    assert "schedlock.sidecar.process" in loaded and "psycopg" in loaded
    unwanted = [
        m
        for m in loaded
        if m.split(".")[0] in NOT_IN_THE_SIDECAR or m.startswith(NOT_IN_THE_SIDECAR)
    ]
    assert unwanted == []
