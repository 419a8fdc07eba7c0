"""Migrations: numbered SQL files, the same ids and order on PostgreSQL and SQLite.

``NNNN_name.sql`` is written once, in PostgreSQL's DDL, and SQLite reads it through
:data:`SQLITE_TYPES` (its timestamps are ISO 8601 UTC text and its payloads JSON text);
``NNNN_name.<dialect>.sql``, when present, adds what only that dialect has (PostgreSQL's
NOTIFY triggers).  Only the ids and names are recorded, so the files may be reorganised as
long as each replays to the same schema (``tests/integration/test_store.py`` checks it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

_NAME = re.compile(r"^(\d{4})_(\w+?)(?:\.(postgres|sqlite))?\.sql$")
# PostgreSQL DDL -> SQLite DDL, in order (a rowid alias for ids; no server-side now()).
SQLITE_TYPES = (
    (re.compile(r"\bbigserial PRIMARY KEY\b"), "integer PRIMARY KEY AUTOINCREMENT"),
    (re.compile(r"\bjsonb NOT NULL DEFAULT '\{\}'::jsonb"), "text NOT NULL DEFAULT '{}'"),
    (re.compile(r"\btimestamptz NOT NULL DEFAULT now\(\)"), "text NOT NULL"),
    (re.compile(r"\btimestamptz\b"), "text"),
    (re.compile(r"\bdouble precision\b"), "real"),
    (re.compile(r"\bbigint\b"), "integer"),
)


@dataclass(frozen=True)
class Migration:
    id: int
    name: str
    sql: str


def for_sqlite(sql: str) -> str:
    for pattern, replacement in SQLITE_TYPES:
        sql = pattern.sub(replacement, sql)
    return sql


@cache
def migrations(dialect: str) -> tuple[Migration, ...]:
    shared: dict[tuple[int, str], str] = {}
    own: dict[tuple[int, str], str] = {}
    for entry in resources.files("schedlock.store").joinpath("migrations").iterdir():
        match = _NAME.match(entry.name)
        if match and match.group(3) in (None, dialect):
            key = (int(match.group(1)), match.group(2))
            (own if match.group(3) else shared)[key] = entry.read_text("utf-8")
    found = [
        Migration(
            id_, name, "\n".join(filter(None, [_translated(sql, dialect), own.get((id_, name))]))
        )
        for (id_, name), sql in shared.items()
    ]
    found.sort(key=lambda m: m.id)
    ids = [m.id for m in found]
    if ids != list(range(1, len(ids) + 1)) or not own.keys() <= shared.keys():
        raise RuntimeError(f"{dialect} migrations are not numbered 1..n without gaps: {ids}")
    return tuple(found)


def _translated(sql: str, dialect: str) -> str:
    return for_sqlite(sql) if dialect == "sqlite" else sql


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
