"""Named SQL queries (``-- name: <query>`` headers).

``queries/common.sql`` holds the statements both dialects run as written (``:name``
parameters, ``now()`` — the transaction's timestamp on PostgreSQL, the session's on SQLite);
``queries/<dialect>.sql`` holds the ones that differ, under the same names.

``common.sql`` also holds parts (``-- part: <part>`` headers): lines that queries of either
file share, each written once and standing where a query has a line ``-- include: <part>``
(the rules for pruning a key's term that both dialects' ``prune_terms`` apply, say).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from importlib import resources

from schedlock.store.migrations import included

_HEADER = re.compile(r"^-- (name|part): (\w+)\s*$", re.M)
# A ``:name`` parameter outside a string literal (``::type`` casts are not parameters).
_PARAM = re.compile(r"'[^']*'|(?<!:):([a-z_]\w*)")
# PostgreSQL's size of a JSON value's text, as SQLite says it of the stored text: its bytes,
# not decoded (SQLite has octet_length() from 3.43 only, and a Python function in its place
# would decode the text first: a payload written by hand that is not UTF-8 would fail the query
# instead of its row).
_SQLITE_OCTET_LENGTH = re.compile(r"\boctet_length\(CAST\(([\w.]+) AS text\)\)")


def _parse(file: str) -> tuple[dict[str, str], dict[str, str]]:
    """The queries and the parts of ``file``, as written (a part without its comments)."""
    text = resources.files("schedlock.store").joinpath(f"queries/{file}").read_text("utf-8")
    pieces = _HEADER.split(text)
    queries: dict[str, str] = {}
    parts: dict[str, str] = {}
    for kind, name, body in zip(pieces[1::3], pieces[2::3], pieces[3::3], strict=True):
        if name in queries or name in parts:
            raise ValueError(f"query {name!r} is defined twice in {file}")
        if kind == "name":
            queries[name] = body
        else:
            lines = body.splitlines()
            parts[name] = "\n".join(s for s in lines if s.strip() and not _comment(s))
    return queries, parts


def _query(body: str, parts: Mapping[str, str], file: str) -> str:
    """A query's text: each ``-- include: <part>`` line replaced by the part, comments left
    out."""

    def part(name: str) -> str:
        if name not in parts:
            raise ValueError(f"a query of {file} includes {name!r}, no part of common.sql")
        return parts[name]

    lines = [line for line in included(body, part).strip().splitlines() if not _comment(line)]
    return "\n".join(lines).strip().rstrip(";")


def _comment(line: str) -> bool:
    return line.lstrip().startswith("--")


def pyformat(sql: str) -> str:
    """``:name`` parameters as psycopg's ``%(name)s``."""
    return _PARAM.sub(lambda m: f"%({m.group(1)})s" if m.group(1) else m.group(0), sql)


@cache
def load(dialect: str) -> dict[str, str]:
    common_queries, parts = _parse("common.sql")
    common = {name: _query(body, parts, "common.sql") for name, body in common_queries.items()}
    if dialect == "postgres":
        common = {name: pyformat(sql) for name, sql in common.items()}
        parts = {name: pyformat(sql) for name, sql in parts.items()}
    own_queries, own_parts = _parse(f"{dialect}.sql")
    if own_parts:
        raise ValueError(f"parts {sorted(own_parts)} belong in common.sql, not {dialect}.sql")
    own = {name: _query(body, parts, f"{dialect}.sql") for name, body in own_queries.items()}
    if both := sorted(common.keys() & own.keys()):
        raise ValueError(f"queries {both} are in both common.sql and {dialect}.sql")
    loaded = {**common, **own}
    if dialect == "sqlite":
        loaded = {
            n: _SQLITE_OCTET_LENGTH.sub(r"length(CAST(\1 AS BLOB))", q) for n, q in loaded.items()
        }
    return loaded
