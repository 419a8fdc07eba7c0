"""Leadership with real sidecar processes on a real PostgreSQL: one leader, fast failover."""

from __future__ import annotations

import collections
import functools
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from schedlock.core.identities import Scheduler, scheduler_of
from schedlock.core.logs import Event, records
from schedlock.store.keys import LEADER_CLASS_ID, LockKey
from testbed.checks import assert_duplicates_only_across_crash, assert_one_leader_at_a_time
from testbed.leaders import leaders
from testbed.pg_fixtures import RUNTIME_ENV, SIDECAR_ROLE, PostgresService, as_role
from testbed.rows import insert_rows, wait_published
from testbed.sidecars import SidecarGroup, SidecarProcess, schedlock_cli, wait_for

LEASE, HEARTBEAT = 4.0, 1.0
FAST = {"SCHEDLOCK_LEASE_SECONDS": str(LEASE), "SCHEDLOCK_HEARTBEAT_SECONDS": str(HEARTBEAT)}
# The server grants the lock to the next waiter within milliseconds; what a hand-over may add
# on a shared, noisy machine (a connection's round trips, the new term's transaction).
SLACK = 1.0


@pytest.fixture
def group(tmp_path: Path, migrated_database: str) -> Iterator[SidecarGroup]:
    sidecar_url = as_role(migrated_database, SIDECAR_ROLE)  # no DDL, least privilege
    replicas = SidecarGroup(
        tmp_path, sidecar_url, replicas=3, extra_env={**FAST, **RUNTIME_ENV}
    ).start()
    try:
        yield replicas
    finally:
        replicas.stop()


def leadership_locks(url: str) -> dict[int, list[tuple[int, bool]]]:
    """objid -> [(pid, granted)] for the targets' leadership locks (``LEADER_CLASS_ID``): who
    holds and who waits on them, by backend, which no store verb tells (``key_status`` names
    the keys' leaders: ``testbed.leaders``)."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT objid::int, pid, granted FROM pg_locks WHERE locktype = 'advisory' "
            "AND classid = %s::int::oid AND objsubid = 2 AND objid <> 0 AND database = "
            "(SELECT oid FROM pg_database WHERE datname = current_database())",
            (LEADER_CLASS_ID,),
        ).fetchall()
    holders: dict[int, list[tuple[int, bool]]] = collections.defaultdict(list)
    for objid, pid, granted in rows:
        holders[objid].append((pid, granted))
    return holders


def sessions_of(postgres: PostgresService, url: str, group: SidecarGroup) -> dict[str, int]:
    """Each live sidecar's client sessions on the database (by its application_name)."""
    return {
        s.name: len(postgres.backends(url, application_name=s.name)) for s in group if s.alive()
    }


def arrivals(group: SidecarGroup) -> list[dict[str, object]]:
    assert group.receiver is not None
    return group.receiver.entries()


def leading_a_stream(
    group: SidecarGroup, url: str, prefix: str, rows: int, spacing: float, delivered: int
) -> tuple[list[str], SidecarProcess]:
    """Rows due one after another from now on, and the leader once it has delivered some and
    a standby waits (what each hand-over here measures; a replica that finds the lock free
    leads without a standby place, so one is there from the start)."""
    uids = insert_rows(url, rows, start_in=0.5, spacing=spacing, prefix=prefix)
    leader = group.wait_leader()
    wait_for(lambda: len(arrivals(group)) >= delivered, timeout=20, what=f"{prefix} deliveries")
    wait_for(
        lambda: any(s.role() == "standby" for s in group if s is not leader),
        timeout=10,
        what="a standby",
    )
    return uids, leader


def wait_fired_both(group: SidecarGroup, leader: SidecarProcess) -> None:
    """Until ``leader`` has delivered rows of both keys: a one-shot row and a schedule's slot."""

    def fired(scheduler: Scheduler) -> bool:
        return any(
            e["holder"] == leader.name and scheduler_of(str(e["uid"])) is scheduler
            for e in arrivals(group)
        )

    for scheduler in Scheduler:
        wait_for(
            functools.partial(fired, scheduler),
            timeout=10,
            what=f"{leader.name} to fire a {scheduler} row",
        )


def takeover(group: SidecarGroup, old: SidecarProcess, timeout: float) -> dict[str, Any]:
    """The next publish leader's "acquired leadership" record naming ``old`` as the previous
    holder.  Its ``gap_ms`` is the hand-over on the database clock: from the old term's last
    heartbeat (or its release) to the new term — no local clock, no sleep."""

    def found() -> dict[str, Any] | None:
        for sidecar in group:
            if sidecar is old:
                continue
            for record in records(sidecar.log_text(), Event.LEADERSHIP_ACQUIRED):
                if record.get("previous_holder") == old.name and record["key"].startswith(
                    "publish/"
                ):
                    return record
        return None

    record: dict[str, Any] = wait_for(found, timeout=timeout, what=f"a leader after {old.name}")
    return record


def gap_seconds(record: dict[str, Any]) -> float:
    return float(record["gap_ms"]) / 1000


def test_one_session_per_sidecar_leads_both_keys(
    group: SidecarGroup, postgres: PostgresService, migrated_database: str
) -> None:
    """3 replicas, the defaults: the leader holds its target's leadership lock and both keys'
    locks on one session, the standby waits on one session, the reserve holds none."""
    leader = group.wait_leader("publish")
    assert group.wait_leader("recurring") is leader, "one replica leads both keys"
    wait_for(
        lambda: sorted(sessions_of(postgres, migrated_database, group).values()) == [0, 1, 1],
        timeout=30,
        what="a leader's session, a standby's, a reserve with none",
    )
    (pid,) = postgres.backends(migrated_database, application_name=leader.name)
    # A standby's wait re-queues every second (it commits between slices so as not to hold
    # back VACUUM): for that moment it is not in pg_locks.  Every sample has the leader's one
    # session leading both keys and holding the leadership lock, and at most one waiter, for
    # the leadership lock.
    both = {LockKey(s, group.namespace, group.target): leader.name for s in Scheduler}
    standby_seen = False
    for _ in range(20):
        assert leaders(migrated_database) == both
        (leading,) = leadership_locks(migrated_database).values()
        assert sorted(leading, key=lambda e: not e[1])[0] == (pid, True), leading
        assert len(leading) <= 2, leading  # the leader, one standby
        standby_seen = standby_seen or len(leading) == 2
        for scheduler in ("publish", "recurring"):
            assert group.leaders(scheduler) == [leader]
        time.sleep(0.1)
    if not standby_seen:
        wait_for(
            lambda: len(next(iter(leadership_locks(migrated_database).values()))) == 2,
            timeout=10,
            what="the standby queued for the leadership lock",
        )


def test_both_keys_move_together_on_sigkill_and_sigterm(
    group: SidecarGroup, postgres: PostgresService, migrated_database: str
) -> None:
    """Both keys' leadership moves as one on a SIGKILL and on a SIGTERM, with nothing lost:
    every row delivered, a second delivery only of the killed leader's in-flight rows (same
    key), one leader per key and term, and the schedule firing under each leader."""
    schedlock_cli(
        "schedule",
        "--target",
        "demo",
        "--cron",
        "@every 1s",
        "--name",
        "tick",
        url=migrated_database,
    )
    uids, first = leading_a_stream(group, migrated_database, "both", 600, 0.02, 30)
    assert group.wait_leader("recurring") is first
    wait_fired_both(group, first)
    first.signal(signal.SIGKILL)
    second = group.wait_leader("publish", timeout=10)
    assert second is not first
    wait_for(
        lambda: group.leaders("recurring") == [second],
        timeout=10,
        what="the publish leader to lead the recurring key too",
    )
    # The reserve takes the standby place at its turn; then a graceful hand-over.
    wait_for(
        lambda: sorted(sessions_of(postgres, migrated_database, group).values()) == [1, 1],
        timeout=30,
        what="the last replica standing by",
    )
    # Each leader fires both keys' rows before it goes: a term that a reserve's early turn
    # cuts short might end before the schedule's next slot (1 s) is due.
    wait_fired_both(group, second)
    second.signal(signal.SIGTERM)
    assert second.wait(10) == 0
    third = group.wait_leader("publish", timeout=10)
    assert third not in (first, second)
    wait_for(
        lambda: group.leaders("recurring") == [third],
        timeout=10,
        what="the last replica to lead the recurring key too",
    )
    wait_published(migrated_database, "both", len(uids), timeout=60)
    wait_fired_both(group, third)
    entries = arrivals(group)
    assert {str(e["uid"]) for e in entries} >= set(uids)
    assert_duplicates_only_across_crash(entries, crashed={first.name})
    assert_one_leader_at_a_time(entries)
    for scheduler in Scheduler:
        holders = {e["holder"] for e in entries if scheduler_of(str(e["uid"])) is scheduler}
        assert holders == {first.name, second.name, third.name}, (scheduler, holders)


def test_sigkill_failover_is_fast_and_loses_nothing(
    group: SidecarGroup, migrated_database: str
) -> None:
    uids, leader = leading_a_stream(group, migrated_database, "kill", 300, 0.02, 50)
    leader.signal(signal.SIGKILL)
    # The killed session ends at once: granted within a heartbeat of its last one.
    new = takeover(group, leader, timeout=10)
    assert not new["previous_released"]
    assert gap_seconds(new) < HEARTBEAT + SLACK, new
    wait_published(migrated_database, "kill", len(uids))
    assert any(e["holder"] != leader.name for e in arrivals(group)), "nobody took over"
    delivered = {str(e["uid"]) for e in arrivals(group)}
    assert delivered == set(uids)
    assert_duplicates_only_across_crash(arrivals(group), crashed={leader.name})


def test_sigstop_past_the_lease(group: SidecarGroup, migrated_database: str) -> None:
    _, leader = leading_a_stream(group, migrated_database, "stop", 400, 0.025, 20)
    leader.signal(signal.SIGSTOP)
    try:
        new = takeover(group, leader, timeout=LEASE + 10)
        # The frozen leader's session ends a lease after its last statement (a heartbeat, or a
        # claim up to a heartbeat later): never sooner, and then the next waiter is granted.
        assert LEASE - SLACK <= gap_seconds(new) < LEASE + HEARTBEAT + SLACK, new
        resumed_at = time.time()
    finally:
        leader.signal(signal.SIGCONT)
    # The resumed process finds its session gone, steps down and changes no row.
    wait_for(lambda: not leader.leads(), timeout=10, what="the resumed leader to step down")
    wait_published(migrated_database, "stop", 400)
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
    _, leader = leading_a_stream(group, migrated_database, "term", 200, 0.02, 20)
    pids = postgres.backends(migrated_database, application_name=leader.name)
    assert pids
    for pid in pids:
        postgres.terminate_backend(pid)
    new = takeover(group, leader, timeout=10)
    assert gap_seconds(new) < HEARTBEAT + SLACK, new
    wait_published(migrated_database, "term", 200)
    assert leader.alive(), "the old leader must reconnect as a follower, not crash"
    wait_for(leader.ready, timeout=10, what="the old leader to reconnect")


def test_sigterm_hands_over_quickly_and_misses_nothing(
    group: SidecarGroup, migrated_database: str
) -> None:
    uids, leader = leading_a_stream(group, migrated_database, "grace", 200, 0.02, 30)
    leader.signal(signal.SIGTERM)
    assert leader.wait(10) == 0
    new = takeover(group, leader, timeout=10)
    assert new["previous_released"], "a checked unlock, recorded as a release"
    assert gap_seconds(new) < SLACK, new
    wait_published(migrated_database, "grace", len(uids))
    counts = collections.Counter(str(e["uid"]) for e in arrivals(group))
    assert set(counts) == set(uids)
    assert max(counts.values()) == 1, "a graceful hand-over delivered something twice"
