"""The status sync's store verbs against real databases: its cursor (migration 0006), the
sweep's paging, and what the sweep's query costs on a table with history."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from schedlock.store import SweepPosition, open_store
from testbed.pg_fixtures import OPERATOR_ROLE, SIDECAR_ROLE, as_role

CURSOR = "status-sync"
TOGETHER = 7  # rows one statement changed together (one now()), read in pages of 3


def insert_finished(url: str, count: int, *, prefix: str, ago: str = "0 seconds") -> None:
    """``count`` published one-shot rows, as the store leaves them, changed in one statement."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            """
            INSERT INTO schedlock_publishes (scheduler, namespace, name, uid, generation, target,
                due_at, next_attempt_at, payload, state, attempts, term, holder, last_status,
                fired_at, finished_at, created_at, updated_at)
            SELECT 'publish', 'default', %(prefix)s || i, %(prefix)s || i, 1, 'demo',
                   now() - %(ago)s::interval, now() - %(ago)s::interval, '{}', 'published', 1, 1,
                   'pod-a', 200, now() - %(ago)s::interval, now() - %(ago)s::interval,
                   now() - %(ago)s::interval, now() - %(ago)s::interval
            FROM generate_series(1, %(count)s) AS i
            """,
            {"prefix": prefix, "count": count, "ago": ago},
        )


@pytest.fixture(params=["postgres", "sqlite"])
def url(request: pytest.FixtureRequest, migrated_database: str, tmp_path: Path) -> str:
    """A migrated database of each dialect."""
    if request.param == "postgres":
        return migrated_database
    url = f"sqlite:///{tmp_path / 'sync.db'}"
    asyncio.run(open_store(url).migrate())
    return url


def test_the_cursor_is_stored_and_read_back_on_both_dialects(url: str) -> None:
    store = open_store(url)

    async def run() -> None:
        first = await store.sync_cursor(CURSOR)
        assert first.watermark_at is None, "no cursor on a new database"
        at = first.now - timedelta(seconds=5)
        await store.store_sync_cursor(CURSOR, at, "operator-a")
        again = await store.sync_cursor(CURSOR)
        assert again.watermark_at == at and again.now >= first.now
        later = again.now + timedelta(seconds=1)
        await store.store_sync_cursor(CURSOR, later, "operator-b")  # an upsert, one row
        assert (await store.sync_cursor(CURSOR)).watermark_at == later
        assert (await store.sync_cursor("another")).watermark_at is None
        await store.close()

    asyncio.run(run())


def test_a_sweep_page_ending_inside_one_statements_rows_skips_none(url: str) -> None:
    store = open_store(url)

    async def run() -> None:
        start = SweepPosition((await store.sync_cursor(CURSOR)).now - timedelta(minutes=1))
        # rows of one statement share updated_at: written through the store, 7 upserts in one
        # SQLite session (one now()), or one INSERT on PostgreSQL
        if url.startswith("postgresql"):
            insert_finished(url, TOGETHER, prefix="together-")
        else:
            await _sqlite_rows_of_one_statement(url, TOGETHER)
        seen: list[str] = []
        position = start
        for _ in range(TOGETHER):  # pages of 3: ends inside the group twice
            records, position = await store.changed_since(position, limit=3)
            seen += [r.uid for r in records]
            if len(records) < 3:
                break
        assert sorted(seen) == sorted(f"together-{i}" for i in range(1, TOGETHER + 1))
        assert len(seen) == TOGETHER, "each row once"
        # the last page's position is the database clock minus the overlap: a later row is read
        assert position.after_id == 0
        await store.close()

    asyncio.run(run())


async def _sqlite_rows_of_one_statement(url: str, count: int) -> None:
    import sqlite3

    from schedlock.store.rows import iso
    from schedlock.store.sqlite import path_of

    conn = sqlite3.connect(path_of(url))
    stamp = iso(datetime.now(UTC))  # the store's fixed-width UTC text, one now() for all
    conn.executemany(
        "INSERT INTO schedlock_publishes (scheduler, namespace, name, uid, generation, target,"
        " due_at, next_attempt_at, payload, state, attempts, created_at, updated_at)"
        " VALUES ('publish', 'default', ?, ?, 1, 'demo', ?, ?, '{}', 'published', 1, ?, ?)",
        [
            (f"together-{i}", f"together-{i}", stamp, stamp, stamp, stamp)
            for i in range(1, count + 1)
        ],
    )
    conn.commit()
    conn.close()


def test_only_the_operator_role_may_keep_the_cursor(migrated_database: str) -> None:
    operator = open_store(as_role(migrated_database, OPERATOR_ROLE))
    sidecar = open_store(as_role(migrated_database, SIDECAR_ROLE))

    async def run() -> None:
        now = (await operator.sync_cursor(CURSOR)).now
        await operator.store_sync_cursor(CURSOR, now, "operator")
        assert (await operator.sync_cursor(CURSOR)).watermark_at == now
        assert await operator.missing_privileges("operator") == (OPERATOR_ROLE, [])
        # the sidecar (and `schedlock status`, which reads terms and rows) have no use for it
        _, missing = await sidecar.missing_privileges("operator")
        assert "SELECT on schedlock_sync_cursors" in missing
        assert await sidecar.missing_privileges("sidecar") == (SIDECAR_ROLE, [])

    asyncio.run(run())
    with (
        psycopg.connect(as_role(migrated_database, SIDECAR_ROLE), autocommit=True) as conn,
        pytest.raises(psycopg.errors.InsufficientPrivilege),
    ):
        conn.execute("SELECT * FROM schedlock_sync_cursors")


def test_the_sweep_reads_only_the_recent_part_of_the_history(migrated_database: str) -> None:
    """The sweep's query from a recent position is a range of the updated_at index: the
    plan reads the rows changed since, not the history (a plan regression fails here)."""
    insert_finished(migrated_database, 50_000, prefix="old-", ago="30 days")
    insert_finished(migrated_database, 20, prefix="new-")
    with psycopg.connect(migrated_database, autocommit=True) as conn:
        conn.execute("ANALYZE schedlock_publishes")
        plan = "\n".join(
            r[0]
            for r in conn.execute(
                "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) "
                "SELECT id, updated_at FROM schedlock_publishes "
                "WHERE updated_at >= now() - interval '1 hour' "
                "AND (updated_at > now() - interval '1 hour' OR id > 0) "
                "ORDER BY updated_at, id LIMIT 500"
            )
        )
    assert "schedlock_publishes_finished" in plan and "Seq Scan" not in plan, plan
    store = open_store(migrated_database)

    async def run() -> None:
        now = (await store.sync_cursor(CURSOR)).now
        records, _ = await store.changed_since(SweepPosition(now - timedelta(hours=1)))
        assert sorted(r.uid for r in records) == sorted(f"new-{i}" for i in range(1, 21))

    asyncio.run(run())
