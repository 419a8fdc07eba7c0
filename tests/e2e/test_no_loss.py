"""Thousands of rows through repeated leader kills: nothing lost, doubles only across a crash."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from schedlock.core.identities import Scheduler
from schedlock.store import LockKey
from testbed.checks import assert_duplicates_only_across_crash
from testbed.leaders import statuses
from testbed.pg_fixtures import RUNTIME_ENV, SIDECAR_ROLE, as_role
from testbed.rows import insert_rows, row_states
from testbed.sidecars import SidecarGroup, wait_for

ROWS = 2000
KILLS = 4


def test_repeated_leader_kills_lose_nothing(tmp_path: Path, migrated_database: str) -> None:
    group = SidecarGroup(
        tmp_path, as_role(migrated_database, SIDECAR_ROLE), replicas=3, extra_env=RUNTIME_ENV
    ).start()
    try:
        uids = insert_rows(migrated_database, ROWS, start_in=1.0, spacing=0.005, prefix="bulk")
        killed: set[str] = set()
        for _ in range(KILLS):
            time.sleep(2.0)
            leader = group.wait_leader()
            leader.signal(signal.SIGKILL)
            killed.add(leader.name)
            group.add().wait_ready()
        wait_for(
            lambda: row_states(migrated_database, "bulk").get("published") == ROWS,
            timeout=60,
            what=f"all {ROWS} rows published",
        )
        assert group.receiver is not None
        entries = group.receiver.entries()
        assert {str(e["uid"]) for e in entries} == set(uids), "a row was lost"
        assert_duplicates_only_across_crash(entries, crashed=killed)
        # Every kill started a new term (a term may deliver nothing if killed at once).
        publish = statuses(migrated_database)[LockKey(Scheduler.PUBLISH, "default", "demo")]
        assert publish.term >= KILLS + 1, publish
    finally:
        group.stop()
