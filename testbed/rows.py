"""Insert rows for tests and benchmarks directly (fast, bulk), as any writer would."""

from __future__ import annotations

from typing import Any

import psycopg

from testbed.sidecars import wait_for


def fetch(url: str, sql: str, *params: object) -> list[tuple[Any, ...]]:
    """The rows of one query on a connection of its own (autocommit, closed after)."""
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()


def insert_rows(
    url: str,
    count: int,
    *,
    start_in: float = 0.5,
    spacing: float = 0.01,
    target: str = "demo",
    namespace: str = "default",
    prefix: str = "row",
    max_attempts: int = 5,
    backoff_seconds: float = 0.2,
    deadline_seconds: int | None = None,
) -> list[str]:
    """``count`` one-shot rows due ``start_in`` s from now (database clock), ``spacing`` apart."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            """
            INSERT INTO schedlock_publishes (scheduler, namespace, name, uid, target, due_at,
                next_attempt_at, payload, max_attempts, backoff_seconds, starting_deadline_seconds)
            SELECT 'publish', %(ns)s, %(prefix)s || '-' || i, %(prefix)s || '-' || i, %(target)s,
                   now() + make_interval(secs => %(start)s + i * %(spacing)s),
                   now() + make_interval(secs => %(start)s + i * %(spacing)s),
                   jsonb_build_object('n', i), %(attempts)s, %(backoff)s, %(deadline)s
            FROM generate_series(0, %(count)s - 1) AS i
            RETURNING uid
            """,
            {
                "ns": namespace,
                "prefix": prefix,
                "target": target,
                "start": start_in,
                "spacing": spacing,
                "attempts": max_attempts,
                "backoff": backoff_seconds,
                "deadline": deadline_seconds,
                "count": count,
            },
        ).fetchall()
    return [str(r[0]) for r in rows]


def row_states(url: str, prefix: str | None = None) -> dict[str, int]:
    with psycopg.connect(url, autocommit=True) as conn:
        sql = "SELECT state, count(*) FROM schedlock_publishes"
        params: tuple[object, ...] = ()
        if prefix is not None:
            sql += " WHERE uid LIKE %s"
            params = (prefix + "-%",)
        sql += " GROUP BY state"
        return {str(s): int(n) for s, n in conn.execute(sql, params).fetchall()}


def wait_published(url: str, prefix: str, count: int, timeout: float = 30) -> None:
    """Wait until ``count`` rows named ``prefix-…`` are published: the positive signal a
    delivery scenario ends on (never a sleep)."""
    wait_for(
        lambda: row_states(url, prefix).get("published") == count,
        timeout=timeout,
        what=f"every {prefix} row published",
    )
