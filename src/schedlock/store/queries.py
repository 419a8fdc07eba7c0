"""Named SQL queries (``-- name: <query>`` headers).

``queries/common.sql`` holds the statements both dialects run as written (``:name``
parameters, ``now()`` — the transaction's timestamp on PostgreSQL, the session's on SQLite);
``queries/<dialect>.sql`` holds the ones that differ, under the same names.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_HEADER = re.compile(r"^-- name: (\w+)\s*$", re.M)
# A ``:name`` parameter outside a string literal (``::type`` casts are not parameters).
_PARAM = re.compile(r"'[^']*'|(?<!:):([a-z_]\w*)")


def _parse(file: str) -> dict[str, str]:
    text = resources.files("schedlock.store").joinpath(f"queries/{file}").read_text("utf-8")
    parts = _HEADER.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise ValueError(f"query {name!r} is defined twice in {file}")
        lines = [line for line in body.strip().splitlines() if not line.lstrip().startswith("--")]
        queries[name] = "\n".join(lines).strip().rstrip(";")
    return queries


def pyformat(sql: str) -> str:
    """``:name`` parameters as psycopg's ``%(name)s``."""
    return _PARAM.sub(lambda m: f"%({m.group(1)})s" if m.group(1) else m.group(0), sql)


@cache
def load(dialect: str) -> dict[str, str]:
    common = _parse("common.sql")
    if dialect == "postgres":
        common = {name: pyformat(sql) for name, sql in common.items()}
    own = _parse(f"{dialect}.sql")
    if both := sorted(common.keys() & own.keys()):
        raise ValueError(f"queries {both} are in both common.sql and {dialect}.sql")
    return {**common, **own}
