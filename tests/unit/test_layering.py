"""Import layering that import-linter cannot see (schedlock.operator is a namespace portion)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def offenders(folder: str, forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    result: dict[str, list[str]] = {}
    for path in sorted((REPO / folder).rglob("*.py")):
        bad = sorted(
            m
            for m in imported_modules(path)
            if any(m == f or m.startswith(f + ".") for f in forbidden)
        )
        if bad:
            result[str(path.relative_to(REPO))] = bad
    return result


@pytest.mark.parametrize(
    ("folder", "forbidden"),
    [
        (
            "sidecar",
            ("schedlock.operator", "kopf", "kubernetes", "psycopg", "psycopg_pool", "sqlite3"),
        ),
        ("operator", ("psycopg", "psycopg_pool", "sqlite3", "schedlock.sidecar")),
        ("core", ("kopf", "kubernetes", "schedlock.operator")),
    ],
)
def test_folder_never_imports(folder: str, forbidden: tuple[str, ...]) -> None:
    if folder == "core":
        # the store is the one place that talks to database drivers; the CLI wires commands
        allowed = {"core/cli.py"}
        found = {k: v for k, v in offenders(folder, forbidden).items() if k not in allowed}
    else:
        found = offenders(folder, forbidden)
    assert found == {}


def test_only_the_store_imports_database_drivers() -> None:
    found = offenders("core", ("psycopg", "psycopg_pool", "sqlite3"))
    assert all(path.startswith("core/store/") for path in found), found


def test_the_check_sees_imports() -> None:
    assert "kopf" in imported_modules(REPO / "operator" / "handlers.py")
    assert "schedlock.store.postgres" in imported_modules(REPO / "operator" / "sync.py")
