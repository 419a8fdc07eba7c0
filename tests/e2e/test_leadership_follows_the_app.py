"""Leadership follows the app: real sidecars, each in front of its own real app, on PostgreSQL.

In a pod the native sidecar starts before the app listens and outlives it. A sidecar must hold
leadership only while its own app can take fires, and hand over at once — without burning the
rows' attempts — when the app stops answering (issue 11, point 4: before this, 44 of 60 rows
due every 200 ms ended ``failed`` when the leader's app died while its sidecar ran on).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from schedlock.core.logs import records
from testbed.checks import assert_duplicates_only_across_crash
from testbed.leaders import leaders
from testbed.pg import free_port
from testbed.rows import insert_rows, row_states
from testbed.sidecars import ReceiverProcess, SidecarProcess, http_get, wait_for
from tests.e2e.test_leadership import leadership_locks

FAST = {
    "SCHEDLOCK_LEASE_SECONDS": "4",
    "SCHEDLOCK_HEARTBEAT_SECONDS": "1",
    "SCHEDLOCK_TARGET_CHECK_SECONDS": "0.2",
    "SCHEDLOCK_SCHEDULERS": "publish",
}


def queue(url: str) -> dict[int, list[tuple[int, bool]]]:
    """The holder and the waiters of the target's leadership lock (the key's own lock is only
    ever held, by the leader, never waited for)."""
    return leadership_locks(url)


class Pod:
    """One app and the sidecar in front of it, as the injector builds a pod."""

    def __init__(self, tmp_path: Path, database_url: str, name: str) -> None:
        self.app = ReceiverProcess(tmp_path / f"{name}-app", port=free_port())
        self.sidecar = SidecarProcess(
            name,
            tmp_path,
            {
                "SCHEDLOCK_DATABASE_URL": database_url,
                "SCHEDLOCK_TARGET": "demo",
                "SCHEDLOCK_TARGET_URL": self.app.url,
                **FAST,
            },
        )

    @property
    def name(self) -> str:
        return self.sidecar.name

    def leads(self) -> bool:
        return self.sidecar.leads("publish")

    def target_up(self) -> float | None:
        return self.sidecar.metrics().get("schedlock_target_up")

    def events(self) -> list[str]:
        return [str(r.get("event")) for r in records(self.sidecar.log_text())]

    def stop(self) -> None:
        self.sidecar.stop()
        self.app.stop()


@pytest.fixture
def two_pods(tmp_path: Path, migrated_database: str) -> Iterator[tuple[Pod, Pod]]:
    """Two pods of one app, started (app first, as in steady state): (leader, follower)."""
    pods = [Pod(tmp_path, migrated_database, f"pod-{n}") for n in range(2)]
    try:
        for pod in pods:
            pod.app.start()
            pod.sidecar.start()
        for pod in pods:
            pod.sidecar.wait_ready()
        leader: Pod = wait_for(
            lambda: next((p for p in pods if p.leads()), None), timeout=20, what="a leader"
        )
        yield leader, next(p for p in pods if p is not leader)
    finally:
        for pod in pods:
            pod.stop()


def not_ready_because(sidecar: SidecarProcess, words: str) -> bool:
    status, reason = http_get(sidecar.url("/readyz"))
    return status == 503 and words in reason


def rows(url: str, prefix: str) -> dict[str, tuple[str, int, str | None]]:
    """uid -> (state, attempts, holder)."""
    with psycopg.connect(url, autocommit=True) as conn:
        found = conn.execute(
            "SELECT uid, state, attempts, holder FROM schedlock_publishes WHERE uid LIKE %s",
            (prefix + "-%",),
        ).fetchall()
    return {str(u): (str(s), int(a), h) for u, s, a, h in found}


def wait_finished(url: str, prefix: str, count: int, timeout: float) -> None:
    """Wait until ``count`` rows named ``prefix-…`` are past ``scheduled`` and ``firing``."""

    def finished() -> bool:
        states = row_states(url, prefix)
        return sum(n for s, n in states.items() if s not in ("scheduled", "firing")) == count

    wait_for(finished, timeout=timeout, what=f"every {prefix} row to finish")


def assert_published_without_burned_attempts(
    url: str, prefix: str, dead: Pod, survivor: Pod
) -> None:
    """Every row published; only a request the dead app had received may count one attempt more.

    Such a request may have reached the app before it died — the one at-least-once case — so
    its re-fire carries the same idempotency key and a higher term.
    """
    found = rows(url, prefix)
    states = {state for state, _, _ in found.values()}
    assert states == {"published"}, row_states(url, prefix)
    reached_dead_app = {str(e["uid"]) for e in dead.app.entries()}
    for uid, (_, attempts, holder) in found.items():
        allowed = 2 if uid in reached_dead_app and holder == survivor.name else 1
        assert attempts <= allowed, (uid, attempts, holder)
    by_survivor = {uid for uid, (_, _, holder) in found.items() if holder == survivor.name}
    answered = {str(e["uid"]) for e in survivor.app.entries() if e["status"] == 200}
    assert by_survivor <= answered
    entries = [*dead.app.entries(), *survivor.app.entries()]
    assert_duplicates_only_across_crash(
        [e for e in entries if str(e["uid"]).startswith(prefix + "-")], crashed={dead.name}
    )


def test_leader_whose_app_dies_hands_over_without_burning_attempts(
    two_pods: tuple[Pod, Pod], migrated_database: str
) -> None:
    first, second = two_pods
    insert_rows(migrated_database, 60, start_in=0.5, spacing=0.2, prefix="gone")
    wait_for(lambda: len(first.app.entries()) >= 5, timeout=20, what="fires before the kill")

    first.app.kill()  # the app is gone; its sidecar runs on, as in a terminating pod
    wait_for(second.leads, timeout=10, what="the other replica to lead")
    wait_for(lambda: not first.leads(), timeout=10, what="the old leader to hand over")
    wait_finished(migrated_database, "gone", 60, timeout=40)
    assert_published_without_burned_attempts(migrated_database, "gone", first, second)
    assert "leadership_handed_over" in first.events()
    assert "target_unreachable" in first.events()
    assert not_ready_because(first.sidecar, "target unreachable")
    assert first.target_up() == 0

    # The app comes back: its sidecar is a candidate again, and leads when the other's
    # app goes away in turn.
    first.app.start()
    wait_for(lambda: first.target_up() == 1, timeout=10, what="the app to count as back")
    wait_for(
        lambda: [len(e) for e in queue(migrated_database).values()] == [2],
        timeout=10,
        what="the returned sidecar to wait for the lock again",
    )
    first.sidecar.wait_ready(timeout=10)
    insert_rows(migrated_database, 30, start_in=0.3, spacing=0.2, prefix="back")
    wait_for(
        lambda: sum(str(e["uid"]).startswith("back-") for e in second.app.entries()) >= 5,
        timeout=20,
        what="fires before the second kill",
    )
    second.app.kill()
    wait_for(first.leads, timeout=10, what="the returned sidecar to lead again")
    wait_finished(migrated_database, "back", 30, timeout=40)
    assert_published_without_burned_attempts(migrated_database, "back", second, first)


def test_sidecar_started_before_its_app_holds_no_lock_until_it_answers(
    tmp_path: Path, migrated_database: str
) -> None:
    pod = Pod(tmp_path, migrated_database, "early")
    [uid] = insert_rows(migrated_database, 1, start_in=0.0, prefix="early")
    pod.sidecar.start()
    try:
        wait_for(
            lambda: not_ready_because(pod.sidecar, "target unreachable"),
            timeout=20,
            what="/readyz to say the app is unreachable",
        )
        # The electors exist (their series are exported) and wait for the app, not the lock.
        wait_for(
            lambda: any(k.startswith("schedlock_leader{") for k in pod.sidecar.metrics()),
            timeout=10,
            what="the electors",
        )
        assert "target_unreachable" in pod.events()
        assert pod.target_up() == 0
        assert leaders(migrated_database) == {} and queue(migrated_database) == {}
        assert rows(migrated_database, "early")[uid][:2] == ("scheduled", 0)

        pod.app.start()
        wait_for(pod.leads, timeout=10, what="leadership once the app answers")
        wait_finished(migrated_database, "early", 1, timeout=10)
        assert rows(migrated_database, "early")[uid][:2] == ("published", 1)
        assert [e["attempt"] for e in pod.app.entries()] == [1]
        assert "target_reachable" in pod.events()
    finally:
        pod.stop()


def test_single_replica_whose_app_is_down_fires_nothing_until_it_is_back(
    tmp_path: Path, migrated_database: str
) -> None:
    pod = Pod(tmp_path, migrated_database, "alone")
    try:
        pod.app.start()
        pod.sidecar.start().wait_ready()
        wait_for(pod.leads, timeout=20, what="leadership")
        pod.app.stop()  # SIGTERM: the app closes its port and exits
        wait_for(lambda: not pod.leads(), timeout=10, what="the leader to let go")
        uids = insert_rows(migrated_database, 5, start_in=0.0, spacing=0.0, prefix="wait")
        wait_for(
            lambda: not_ready_because(pod.sidecar, "its rows wait"),
            timeout=10,
            what="/readyz to say the rows wait",
        )
        assert {v[:2] for v in rows(migrated_database, "wait").values()} == {("scheduled", 0)}

        pod.app.start()
        wait_for(pod.leads, timeout=10, what="leadership once the app is back")
        wait_finished(migrated_database, "wait", 5, timeout=10)
        assert {v[:2] for v in rows(migrated_database, "wait").values()} == {("published", 1)}
        assert sorted(str(e["uid"]) for e in pod.app.entries()) == sorted(uids)
    finally:
        pod.stop()


def test_follower_whose_app_is_gone_leaves_the_lock_queue_and_rejoins(
    two_pods: tuple[Pod, Pod], migrated_database: str
) -> None:
    leader, follower = two_pods

    def waiting() -> list[int]:
        return [len(e) for e in queue(migrated_database).values()]

    wait_for(lambda: waiting() == [2], timeout=10, what="the follower in the lock queue")
    follower.app.kill()
    wait_for(lambda: waiting() == [1], timeout=10, what="the follower to leave the queue")
    assert leader.leads()
    follower.app.start()
    wait_for(lambda: waiting() == [2], timeout=10, what="the follower to rejoin the queue")
    assert leader.leads()
