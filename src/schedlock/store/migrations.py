"""Migrations: numbered SQL files, the same ids and order on PostgreSQL and SQLite, each with
the step that undoes it.

``NNNN_name.sql`` is written once, in PostgreSQL's DDL, and SQLite reads it through
:data:`SQLITE_TYPES` (its timestamps are ISO 8601 UTC text and its payloads JSON text);
``NNNN_name.<dialect>.sql``, when present, adds what only that dialect has (PostgreSQL's
NOTIFY triggers and storage parameters).  ``NNNN_name.down.sql`` (and ``.down.<dialect>.sql``)
undo them, the dialect's part first.  Only the ids, names and whether each is additive are
recorded, so the files may be reorganised as long as each replays to the same schema
(``tests/integration/test_store.py`` checks it; ``test_rollback.py`` that down then up is a
replay too; ``hack/migrations_replay.py REV`` that every step, up and down, leaves the
database as the files of git revision REV do).

A line ``-- include: FILE`` (indented or not, also inside a ``$$`` body) stands for the text
of ``FILE``, a part of the same folder that is no migration of its own
(``NNNN_name.<what>.part.sql``, named for the migration that wrote it first), its leading
comment block left out: what a later migration or a down step restores is written once, in
the words of the migration that wrote it, and replays to the same definition.  A part is as
frozen as the migrations that include it, and includes nothing itself.

Two header lines, each in the leading comment block of its file, are required:

- ``-- additive: yes|no`` in ``NNNN_name.sql``: yes when binaries built for the schema before it
  keep working on it (new tables, columns with defaults, indexes, storage).  A binary runs on a
  newer schema when every migration it does not know is additive (:func:`blocking`).
- ``-- loses data: yes|no`` in ``NNNN_name.down.sql`` (a ``.down.<dialect>.sql`` may say yes
  for its dialect): yes when undoing it drops rows an operator would miss.  ``schedlock migrate
  --to`` refuses such a step unless forced.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources

from schedlock.store.errors import MigrationRefused

_NAME = re.compile(r"^(\d{4})_(\w+?)(\.down)?(?:\.(postgres|sqlite))?\.sql$")
_ADDITIVE = re.compile(r"^--\s*additive:\s*(yes|no)\b", re.I)
_LOSES_DATA = re.compile(r"^--\s*loses data:\s*(yes|no)\b", re.I)
# A line that stands for a text written once elsewhere: a migration's part file here, a part of
# common.sql in the named queries (schedlock.store.queries).
INCLUDE = re.compile(r"^[ \t]*--[ \t]*include:[ \t]*(\S+)[ \t]*$", re.M)
# PostgreSQL DDL -> SQLite DDL, in order (a rowid alias for ids; no server-side now()).
SQLITE_TYPES = (
    (re.compile(r"\bbigserial PRIMARY KEY\b"), "integer PRIMARY KEY AUTOINCREMENT"),
    (re.compile(r"\bjsonb NOT NULL DEFAULT '\{\}'::jsonb"), "text NOT NULL DEFAULT '{}'"),
    (re.compile(r"\btimestamptz NOT NULL DEFAULT now\(\)"), "text NOT NULL"),
    (re.compile(r"\btimestamptz\b"), "text"),
    (re.compile(r"\bdouble precision\b"), "real"),
    (re.compile(r"\bbigint\b"), "integer"),
)


class MigrationFilesError(RuntimeError):
    """The migration files shipped with this binary break the convention (a packaging bug)."""


@dataclass(frozen=True)
class Migration:
    id: int
    name: str
    sql: str
    """The up step, shared part then the dialect's."""
    down_sql: str
    """The down step, the dialect's part then the shared one."""
    additive: bool
    """Binaries built for the schema before this one keep working on it."""
    loses_data: bool
    """The down step drops data an operator would miss (refused unless forced)."""


@dataclass(frozen=True)
class Plan:
    """The steps of one ``migrate --to``: migrations to apply, or to undo (newest first)."""

    up: tuple[Migration, ...]
    down: tuple[Migration, ...]


def for_sqlite(sql: str) -> str:
    for pattern, replacement in SQLITE_TYPES:
        sql = pattern.sub(replacement, sql)
    return sql


def header(sql: str, pattern: re.Pattern[str]) -> bool | None:
    """The yes/no of a header line in the file's leading comment block (None: absent)."""
    for line in sql.splitlines():
        stripped = line.strip()
        if not stripped.startswith("--"):
            return None
        if match := pattern.match(stripped):
            return match.group(1).lower() == "yes"
    return None


def parse(files: Mapping[str, str], dialect: str) -> tuple[Migration, ...]:
    """The migrations of ``dialect`` from file names and texts, checked against the convention."""
    parts: dict[tuple[int, str], dict[tuple[bool, bool], str]] = {}
    for file_name, text in files.items():
        match = _NAME.match(file_name)
        if not match or match.group(4) not in (None, dialect):
            continue
        key = (int(match.group(1)), match.group(2))
        label = f"migration {match.group(1)}_{match.group(2)}"
        kind = (bool(match.group(3)), bool(match.group(4)))
        parts.setdefault(key, {})[kind] = _included(text, files, label)
    found: list[Migration] = []
    for (id_, name), texts in sorted(parts.items()):
        label = f"migration {id_:04d}_{name}"
        up, down = texts.get((False, False)), texts.get((True, False))
        if up is None:
            raise MigrationFilesError(f"{label} has no {id_:04d}_{name}.sql")
        if down is None:
            raise MigrationFilesError(f"{label} has no down step {id_:04d}_{name}.down.sql")
        additive = header(up, _ADDITIVE)
        if additive is None:
            raise MigrationFilesError(f"{label} lacks its '-- additive: yes|no' header")
        loses_data = header(down, _LOSES_DATA)
        if loses_data is None:
            raise MigrationFilesError(f"{label}'s down step lacks its '-- loses data: yes|no'")
        own_up, own_down = texts.get((False, True)), texts.get((True, True))
        found.append(
            Migration(
                id=id_,
                name=name,
                sql=_joined([_translated(up, dialect), own_up]),
                down_sql=_joined([own_down, _translated(down, dialect)]),
                additive=additive,
                loses_data=loses_data or bool(own_down and header(own_down, _LOSES_DATA)),
            )
        )
    ids = [m.id for m in found]
    if ids != list(range(1, len(ids) + 1)):
        raise MigrationFilesError(f"{dialect} migrations are not numbered 1..n without gaps: {ids}")
    return tuple(found)


def included(sql: str, part: Callable[[str], str]) -> str:
    """``sql`` with each ``-- include: NAME`` line replaced by ``part(NAME)``."""
    return INCLUDE.sub(lambda match: part(match.group(1)), sql)


def _included(sql: str, files: Mapping[str, str], label: str) -> str:
    """``sql`` with each ``-- include: FILE`` line replaced by FILE's text (leading comments
    left out)."""

    def part(name: str) -> str:
        text = files.get(name)
        if text is None:
            raise MigrationFilesError(f"{label} includes {name}, which is not shipped")
        if INCLUDE.search(text):
            raise MigrationFilesError(f"{label} includes {name}, which includes more")
        lines = text.rstrip("\n").splitlines()
        while lines and (not lines[0].strip() or lines[0].lstrip().startswith("--")):
            lines.pop(0)
        return "\n".join(lines)

    return included(sql, part)


def _joined(sqls: Iterable[str | None]) -> str:
    return "\n".join(filter(None, sqls))


@cache
def migrations(dialect: str) -> tuple[Migration, ...]:
    folder = resources.files("schedlock.store").joinpath("migrations")
    return parse({entry.name: entry.read_text("utf-8") for entry in folder.iterdir()}, dialect)


def _translated(sql: str, dialect: str) -> str:
    return for_sqlite(sql) if dialect == "sqlite" else sql


def latest_id(dialect: str) -> int:
    return migrations(dialect)[-1].id


def blocking(recorded: Iterable[tuple[int, bool]], latest: int) -> int | None:
    """The first migration beyond ``latest`` (a binary's newest) that is not additive, among the
    ``recorded`` (id, additive) pairs: the binary cannot run on the schema (None: it can)."""
    beyond = sorted(id_ for id_, additive in recorded if id_ > latest and not additive)
    return beyond[0] if beyond else None


def plan(known: Sequence[Migration], current: int, target: int, *, force: bool) -> Plan:
    """What ``migrate --to target`` does to a schema at ``current``, or the one-line refusal.

    Up: the known migrations in (current, target].  Down: each migration in (target, current],
    newest first, by its down step; the binary must know each one (it ships the step), and a
    step that loses data needs ``force``.
    """
    latest = known[-1].id if known else 0
    if target > current:
        if target > latest:
            raise MigrationRefused(
                f"migration {target} is unknown to this schedlock (it knows 1 to {latest}): "
                f"run `schedlock migrate --to {target}` with the release that ships it"
            )
        return Plan(up=tuple(m for m in known if current < m.id <= target), down=())
    if current > latest and target < current:
        raise MigrationRefused(
            f"the schema is at migration {current} but this schedlock knows the down steps of "
            f"migrations 1 to {latest} only: run `schedlock migrate --to {target}` with the "
            f"release that migrated it to {current}"
        )
    down = tuple(m for m in reversed(known) if target < m.id <= current)
    losing = [m for m in down if m.loses_data]
    if losing and not force:
        names = ", ".join(f"migration {m.id} ({m.name})" for m in losing)
        raise MigrationRefused(
            f"taking the schema from migration {current} down to {target} undoes {names}, which "
            "loses data: rerun with --force if that is what you want"
        )
    return Plan(up=(), down=down)


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
