"""Named SQL queries kept in ``queries/<dialect>.sql`` (``-- name: <query>`` headers)."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_HEADER = re.compile(r"^-- name: (\w+)\s*$", re.M)


@cache
def load(dialect: str) -> dict[str, str]:
    text = resources.files("schedlock.store").joinpath(f"queries/{dialect}.sql").read_text("utf-8")
    parts = _HEADER.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise ValueError(f"query {name!r} is defined twice in {dialect}.sql")
        lines = [line for line in body.strip().splitlines() if not line.lstrip().startswith("--")]
        queries[name] = "\n".join(lines).strip().rstrip(";")
    return queries
