"""Leadership with real sidecar processes on a real PostgreSQL: one leader, fast failover."""

from __future__ import annotations

import collections
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from schedlock.core.logs import Event, records
from schedlock.store.keys import SCHEDLOCK_CLASS_ID
from testbed.checks import assert_duplicates_only_across_crash
from testbed.pg_fixtures import SIDECAR_ROLE, PostgresService, as_role
from testbed.rows import insert_rows, row_states
from testbed.sidecars import SidecarGroup, wait_for

LEASE = 4.0
FAST = {"SCHEDLOCK_LEASE_SECONDS": str(LEASE), "SCHEDLOCK_HEARTBEAT_SECONDS": "1"}


@pytest.fixture
def group(tmp_path: Path, migrated_database: str) -> Iterator[SidecarGroup]:
    sidecar_url = as_role(migrated_database, SIDECAR_ROLE)  # no DDL, least privilege
    replicas = SidecarGroup(
        tmp_path, sidecar_url, replicas=3, extra_env={**FAST, "SCHEDLOCK_MIGRATE": "off"}
    ).start()
    try:
        yield replicas
    finally:
        replicas.stop()


def lock_holders(url: str) -> dict[int, list[tuple[int, bool]]]:
    """objid -> [(pid, granted)] for schedlock's advisory locks."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT objid::int, pid, granted FROM pg_locks WHERE locktype = 'advisory' "
            "AND classid = %s::int::oid AND objsubid = 2 AND database = "
            "(SELECT oid FROM pg_database WHERE datname = current_database())",
            (SCHEDLOCK_CLASS_ID,),
        ).fetchall()
    holders: dict[int, list[tuple[int, bool]]] = collections.defaultdict(list)
    for objid, pid, granted in rows:
        holders[objid].append((pid, granted))
    return holders


def arrivals(group: SidecarGroup) -> list[dict[str, object]]:
    assert group.receiver is not None
    return group.receiver.entries()


def test_exactly_one_leader_per_key(group: SidecarGroup, migrated_database: str) -> None:
    group.wait_leader("publish")
    group.wait_leader("recurring")
    for _ in range(20):
        holders = lock_holders(migrated_database)
        assert len(holders) == 2, holders  # publish and recurring keys
        for entries in holders.values():
            assert sum(granted for _, granted in entries) == 1, entries
            assert len(entries) == 3  # one holder, two blocked waiters
        for scheduler in ("publish", "recurring"):
            assert len(group.leaders(scheduler)) == 1
        time.sleep(0.1)


def test_sigkill_failover_is_fast_and_loses_nothing(
    group: SidecarGroup, migrated_database: str
) -> None:
    uids = insert_rows(migrated_database, 300, start_in=0.5, spacing=0.02, prefix="kill")
    leader = group.wait_leader()
    wait_for(lambda: len(arrivals(group)) >= 50, timeout=20, what="deliveries before the kill")
    killed_at = time.time()
    leader.signal(signal.SIGKILL)
    wait_for(
        lambda: row_states(migrated_database, "kill").get("published") == len(uids),
        timeout=30,
        what="every row published",
    )
    after = [
        e for e in arrivals(group) if float(e["arrival"]) > killed_at and e["holder"] != leader.name
    ]
    assert after, "nobody delivered after the kill"
    first_after = min(float(e["arrival"]) for e in after)
    assert first_after - killed_at < 1.0, (
        f"first claim {first_after - killed_at:.3f}s after SIGKILL"
    )
    delivered = {str(e["uid"]) for e in arrivals(group)}
    assert delivered == set(uids)
    assert_duplicates_only_across_crash(arrivals(group), crashed={leader.name})


def test_sigstop_past_the_lease(group: SidecarGroup, migrated_database: str) -> None:
    insert_rows(migrated_database, 400, start_in=0.5, spacing=0.025, prefix="stop")
    leader = group.wait_leader()
    wait_for(lambda: len(arrivals(group)) >= 20, timeout=20, what="deliveries before the freeze")
    stopped_at = time.time()
    leader.signal(signal.SIGSTOP)
    try:
        new = wait_for(
            lambda: [
                e
                for e in arrivals(group)
                if e["holder"] != leader.name and float(str(e["arrival"])) > stopped_at
            ],
            timeout=LEASE + 5,
            what="a new leader's delivery",
        )
        takeover = min(float(str(e["arrival"])) for e in new) - stopped_at
        assert takeover < LEASE + 1.0, f"takeover after {takeover:.2f}s with a {LEASE}s lease"
        resumed_at = time.time()
    finally:
        leader.signal(signal.SIGCONT)
    # The resumed process finds its session gone, steps down and changes no row.
    wait_for(lambda: not leader.leads(), timeout=10, what="the resumed leader to step down")
    wait_for(
        lambda: row_states(migrated_database, "stop").get("published") == 400,
        timeout=30,
        what="every row published",
    )
    with psycopg.connect(migrated_database, autocommit=True) as conn:
        changed = conn.execute(
            "SELECT count(*) FROM schedlock_publishes WHERE holder = %s "
            "AND updated_at > to_timestamp(%s)",
            (leader.name, resumed_at),
        ).fetchone()
    assert changed == (0,)
    assert list(records(leader.log_text(), Event.LOCK_SESSION_LOST))
    assert leader.alive()
    late = [
        e
        for e in arrivals(group)
        if e["holder"] == leader.name and float(str(e["arrival"])) > resumed_at + 0.5
    ]
    assert not late, f"the stale leader delivered after resuming: {late[:3]}"


def test_terminated_lock_session_hands_over(
    group: SidecarGroup, postgres: PostgresService, migrated_database: str
) -> None:
    insert_rows(migrated_database, 200, start_in=0.5, spacing=0.02, prefix="term")
    leader = group.wait_leader()
    wait_for(lambda: len(arrivals(group)) >= 20, timeout=20, what="deliveries")
    pids = postgres.backends(migrated_database, application_name=leader.name)
    assert pids
    cut_at = time.time()
    for pid in pids:
        postgres.terminate_backend(pid)
    new = wait_for(
        lambda: [
            e
            for e in arrivals(group)
            if e["holder"] != leader.name and float(str(e["arrival"])) > cut_at
        ],
        timeout=5,
        what="a new leader after pg_terminate_backend",
    )
    assert min(float(str(e["arrival"])) for e in new) - cut_at < 1.0
    wait_for(
        lambda: row_states(migrated_database, "term").get("published") == 200,
        timeout=30,
        what="every row published",
    )
    assert leader.alive(), "the old leader must reconnect as a follower, not crash"
    wait_for(leader.ready, timeout=10, what="the old leader to reconnect")


def test_sigterm_hands_over_quickly_and_misses_nothing(
    group: SidecarGroup, migrated_database: str
) -> None:
    uids = insert_rows(migrated_database, 200, start_in=0.5, spacing=0.02, prefix="grace")
    leader = group.wait_leader()
    wait_for(lambda: len(arrivals(group)) >= 30, timeout=20, what="deliveries")
    sent_at = time.time()
    leader.signal(signal.SIGTERM)
    assert leader.wait(10) == 0
    new = wait_for(
        lambda: [e for e in arrivals(group) if e["holder"] != leader.name],
        timeout=5,
        what="the next leader's delivery",
    )
    assert min(float(str(e["arrival"])) for e in new) - sent_at < 1.0
    wait_for(
        lambda: row_states(migrated_database, "grace").get("published") == len(uids),
        timeout=30,
        what="every row published",
    )
    counts = collections.Counter(str(e["uid"]) for e in arrivals(group))
    assert set(counts) == set(uids)
    assert max(counts.values()) == 1, "a graceful hand-over delivered something twice"
