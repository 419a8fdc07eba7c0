"""Rows for the scenarios, inserted in bulk as any writer would (one INSERT … SELECT)."""

from __future__ import annotations

import time
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import psycopg

from testbed.rows import fetch

INSERT = """
INSERT INTO schedlock_publishes (scheduler, namespace, name, uid, target, due_at, next_attempt_at,
                                 payload, max_attempts, backoff_seconds)
SELECT 'publish', %(ns)s, %(prefix)s || '-' || (%(first)s + i), %(prefix)s || '-' || (%(first)s + i),
       %(target)s,
       to_timestamp(%(start)s) + make_interval(secs => i * %(spacing)s),
       to_timestamp(%(start)s) + make_interval(secs => i * %(spacing)s),
       jsonb_build_object('n', %(first)s + i), 3, 0.2
FROM generate_series(0, %(count)s - 1) AS i
"""


def insert_due(
    url: str,
    *,
    prefix: str,
    count: int,
    start_at: float,
    spacing: float,
    target: str,
    namespace: str = "default",
) -> None:
    """``count`` one-shot rows for ``target`` due at ``start_at`` (epoch seconds) + i × ``spacing``."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            INSERT,
            {
                "ns": namespace,
                "prefix": prefix,
                "target": target,
                "start": start_at,
                "spacing": spacing,
                "count": count,
                "first": 0,
            },
        )


def due_times(url: str, prefix: str) -> dict[str, float]:
    """uid -> due time (epoch seconds) of the rows with this prefix."""
    rows = fetch(
        url,
        "SELECT uid, extract(epoch FROM due_at)::float8 FROM schedlock_publishes WHERE uid LIKE %s",
        prefix + "-%",
    )
    return {str(uid): float(due) for uid, due in rows}


@dataclass(eq=False)
class RowStream:
    """Keeps rows due every ``spacing`` seconds from now until ``ahead`` seconds ahead."""

    url: str
    _: KW_ONLY
    prefix: str
    spacing: float
    namespace: str
    target: str
    next_due: float = field(default_factory=lambda: time.time() + 0.5)
    issued: int = 0
    conn: psycopg.Connection[Any] | None = None

    def top_up(self, ahead: float = 6.0) -> None:
        now = time.time()
        if self.next_due - now > ahead / 2:
            return
        self.next_due = max(self.next_due, now)
        count = int((now + ahead - self.next_due) / self.spacing)
        if count <= 0:
            return
        if self.conn is None or self.conn.closed:
            self.conn = psycopg.connect(self.url, autocommit=True)
        first, self.issued = self.issued, self.issued + count
        self.conn.execute(
            INSERT,
            {
                "ns": self.namespace,
                "prefix": self.prefix,
                "target": self.target,
                "start": self.next_due,
                "spacing": self.spacing,
                "count": count,
                "first": first,
            },
        )
        self.next_due += count * self.spacing

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
