"""A session waiting for an advisory lock (a standby sidecar, the operator's second replica)
must not hold back the database's xmin horizon, against a real PostgreSQL.

A statement holds a snapshot while it runs; a standby waiting in one ``pg_advisory_lock`` for
as long as the leader lives kept VACUUM from removing any row deleted since, in every table of
the database — the app's too — and our live-row indexes filled with dead entries (the history
bench measured claims of 100–250 ms and the hot path falling behind during a prune).  The wait
commits every ``LOCK_WAIT_SLICE_MS`` (the ``lock`` query): the rows deleted while a standby
waits are removable a slice later, and the server logs nothing for it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest

from schedlock.store import LockKey, open_store
from schedlock.store.postgres import LOCK_WAIT_SLICE_MS
from testbed.pg_fixtures import PostgresService
from testbed.sidecars import wait_for

SLICE = LOCK_WAIT_SLICE_MS / 1000
KEY = LockKey("publish", "default", "horizon")
SYNC_OBJID = 424242


def _dead_rows_after_vacuum(postgres: PostgresService, url: str) -> int:
    postgres.execute("VACUUM schedlock_horizon_probe", url=url)
    [(dead,)] = postgres.execute(
        "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'schedlock_horizon_probe'",
        url=url,
    )
    return int(str(dead))


def _waiting_for(postgres: PostgresService, url: str, application_name: str) -> float | None:
    """How long the waiting session's current transaction has held its snapshot (s)."""
    found = postgres.execute(
        "SELECT extract(epoch FROM now() - xact_start)::float8 FROM pg_stat_activity "
        "WHERE application_name = %s AND wait_event_type = 'Lock' AND wait_event = 'advisory'",
        application_name,
        url=url,
    )
    return float(str(found[0][0])) if found else None


@pytest.mark.parametrize("waiter", ["lock session", "held lock"])
async def test_a_session_waiting_for_a_lock_lets_vacuum_remove_what_was_deleted_meanwhile(
    postgres: PostgresService, migrated_database: str, waiter: str
) -> None:
    url = migrated_database
    log = postgres.server.logfile if postgres.server is not None else None
    logged_before = log.stat().st_size if log is not None else 0
    store = open_store(url)
    leader = store.lock_session(KEY, "leader", 10)
    standby = store.lock_session(KEY, "standby", 10)
    await leader.connect()
    await leader.acquire()
    held = await store.hold_lock(SYNC_OBJID, "sync-first")
    name = "standby" if waiter == "lock session" else "sync-second"
    wait: Callable[[], Awaitable[object]]
    if waiter == "lock session":
        await standby.connect()
        wait = standby.acquire
    else:

        async def wait() -> object:
            return await store.hold_lock(SYNC_OBJID, "sync-second")

    waiting = asyncio.create_task(wait())
    try:
        await asyncio.to_thread(
            wait_for,
            lambda: _waiting_for(postgres, url, name) is not None,
            10,
            what="the waiter queued",
        )
        postgres.execute(
            "CREATE TABLE schedlock_horizon_probe AS SELECT generate_series(1, 1000) AS i",
            url=url,
        )
        postgres.execute("DELETE FROM schedlock_horizon_probe", url=url)
        deleted_at = time.monotonic()
        # Three slices later the waiter is still waiting (the leader holds on), and its
        # snapshot is never older than a slice (and a slice of margin for a busy machine).
        while time.monotonic() - deleted_at < 3 * SLICE:
            held_for = await asyncio.to_thread(_waiting_for, postgres, url, name)
            assert held_for is None or held_for < 2 * SLICE, held_for
            await asyncio.sleep(0.2)
        assert not waiting.done()
        # What was deleted after the waiter queued is removable now.
        assert await asyncio.to_thread(_dead_rows_after_vacuum, postgres, url) == 0
        # The slices that ended were errors caught in the block: none reached the server log.
        if log is not None:
            with log.open("rb") as text:
                text.seek(logged_before)
                assert b"lock timeout" not in text.read()
        # And the waiter still gets the lock the moment it is free.
        if waiter == "lock session":
            await leader.close()
        else:
            await held.close()
        got = await asyncio.wait_for(waiting, 10)
        if waiter == "held lock":
            await got.close()  # type: ignore[attr-defined]
    finally:
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        await leader.close()
        await standby.close()
        await held.close()
        await store.close()
