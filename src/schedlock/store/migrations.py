"""Migrations: numbered SQL files, one per dialect, same ids and order on PostgreSQL and SQLite."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

_NAME = re.compile(r"^(\d{4})_(\w+)\.(postgres|sqlite)\.sql$")


@dataclass(frozen=True)
class Migration:
    id: int
    name: str
    sql: str


@cache
def migrations(dialect: str) -> tuple[Migration, ...]:
    found: list[Migration] = []
    for entry in resources.files("schedlock.store").joinpath("migrations").iterdir():
        match = _NAME.match(entry.name)
        if match and match.group(3) == dialect:
            found.append(Migration(int(match.group(1)), match.group(2), entry.read_text("utf-8")))
    found.sort(key=lambda m: m.id)
    ids = [m.id for m in found]
    if ids != list(range(1, len(ids) + 1)):
        raise RuntimeError(f"{dialect} migrations are not numbered 1..n without gaps: {ids}")
    return tuple(found)


def latest_id(dialect: str) -> int:
    return migrations(dialect)[-1].id


def split_statements(sql: str) -> list[str]:
    """Split a migration on ';' at line ends, keeping $$-quoted function bodies whole."""
    statements: list[str] = []
    current: list[str] = []
    in_body = False
    for line in sql.splitlines():
        if line.strip().startswith("--") and not in_body:
            continue
        current.append(line)
        if line.count("$$") % 2 == 1:
            in_body = not in_body
        if not in_body and line.rstrip().endswith(";"):
            statement = "\n".join(current).strip()
            if statement.strip(";").strip():
                statements.append(statement)
            current = []
    tail = "\n".join(current).strip()
    if tail:
        statements.append(tail)
    return statements
