"""A row is the unit of failure, and max_attempts holds on every path (issue 21), against a real
PostgreSQL and a running sidecar process.

Poison rows are written by SQL as a superuser, as another tool or a migration gone wrong would:
nothing is bypassed but the CLI.  With migration 0007's bound in place a 20 MB payload is
refused at insert; a row from before that migration (which checks no existing row) is made by
disabling the bound's trigger for the insert (``ALTER TABLE … DISABLE TRIGGER``; the trigger is
ENABLE ALWAYS, so ``session_replication_role = replica`` would not skip it).
"""

from __future__ import annotations

import signal
import time
from datetime import datetime
from pathlib import Path

import psycopg
import pytest

from schedlock.core.identities import parse_rfc3339
from testbed.pg_fixtures import RUNTIME_ENV, SIDECAR_ROLE, as_role
from testbed.rows import fetch, insert_rows
from testbed.sidecars import SidecarGroup, wait_for

GOOD = 20
DEEP = 3_000
BIG = 20_000_000
ON_TIME_SECONDS = 2.0


def insert_poison(
    url: str, uid: str, payload_sql: str, *, due_in: float, attempts: int = 3
) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            f"""
            INSERT INTO schedlock_publishes (scheduler, namespace, name, uid, target, due_at,
                next_attempt_at, payload, max_attempts, backoff_seconds)
            VALUES ('publish', 'default', %(uid)s, %(uid)s, 'demo',
                    now() + make_interval(secs => %(due)s), now() + make_interval(secs => %(due)s),
                    {payload_sql}, %(attempts)s, 0.2)
            """,
            {"uid": uid, "due": due_in, "attempts": attempts},
        )


def insert_before_the_bound(url: str, uid: str, payload_sql: str, *, due_in: float) -> None:
    """A row as old as the schema before migration 0007: written with its trigger disabled,
    which then comes back as the migration leaves it."""
    trigger = "TRIGGER schedlock_publishes_payload_size"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"ALTER TABLE schedlock_publishes DISABLE {trigger}")
    insert_poison(url, uid, payload_sql, due_in=due_in)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"ALTER TABLE schedlock_publishes ENABLE ALWAYS {trigger}")


def row(url: str, uid: str) -> tuple[str, int, int, str | None]:
    [(state, attempts, max_attempts, error)] = fetch(
        url,
        "SELECT state, attempts, max_attempts, last_error FROM schedlock_publishes WHERE uid = %s",
        uid,
    )
    return str(state), int(attempts), int(max_attempts), error


def finished(url: str, uid: str) -> bool:
    return row(url, uid)[0] not in ("scheduled", "firing")


def test_poison_rows_fail_alone_and_the_good_ones_fire_on_time(
    tmp_path: Path, migrated_database: str
) -> None:
    url = migrated_database
    deep = '{"a": ' + "[" * DEEP + "]" * DEEP + "}"
    with pytest.raises(psycopg.errors.CheckViolation) as refused:
        insert_poison(
            url, "big-at-insert", f"jsonb_build_object('blob', repeat('x', {BIG}))", due_in=0
        )
    assert str(refused.value).startswith("payload is 20000012 bytes as JSON; at most 16384 bytes")
    assert refused.value.diag.constraint_name == "schedlock_publishes_payload_size"

    group = SidecarGroup(
        tmp_path, as_role(url, SIDECAR_ROLE), replicas=1, extra_env=RUNTIME_ENV
    ).start()
    try:
        receiver = group.receiver
        assert receiver is not None
        leader = group.wait_leader()
        # All due in the same instant: one claim batch holds the poison and the good rows.
        due_in = 3.0
        insert_poison(url, "deep", f"'{deep}'::jsonb", due_in=due_in)
        insert_before_the_bound(
            url, "big", f"jsonb_build_object('blob', repeat('x', {BIG}))", due_in=due_in
        )
        uids = insert_rows(url, GOOD, start_in=due_in, spacing=0.0, prefix="good")
        wait_for(lambda: finished(url, "deep") and finished(url, "big"), timeout=30, what="poison")
        wait_for(
            lambda: len({e["uid"] for e in receiver.entries()}) >= GOOD,
            timeout=30,
            what="every good row delivered",
        )
        assert leader.alive(), leader.log_text()[-3000:]
        assert leader.leads(), "the sidecar kept leading"

        state, attempts, max_attempts, error = row(url, "deep")
        assert (state, error) == ("failed", "payload nests deeper than 32 levels")
        assert attempts <= max_attempts
        state, attempts, max_attempts, error = row(url, "big")
        assert state == "failed" and attempts <= max_attempts
        assert error is not None
        assert error.startswith("payload is 20000012 bytes as JSON; at most 16384 bytes")

        assert group.receiver is not None
        entries = group.receiver.entries()
        assert {e["uid"] for e in entries} == set(uids), "only the good rows reach the app"
        for entry in entries:
            due = parse_rfc3339(entry["scheduledAt"])
            late = (
                datetime.fromtimestamp(entry["arrival"], due.tzinfo).timestamp() - due.timestamp()
            )
            assert late < ON_TIME_SECONDS, (entry["uid"], late)
        assert "Traceback" not in leader.log_text()
    finally:
        group.stop()


def test_an_orphan_without_attempts_left_ends_failed_not_fired(
    tmp_path: Path, migrated_database: str
) -> None:
    """A crashed leader's rows (firing, an old term): one at its last attempt ends failed, one
    with attempts left is fired again with the same key."""
    url = migrated_database
    with psycopg.connect(url, autocommit=True) as conn:
        for uid, attempts in (("spent", 3), ("left", 1)):
            conn.execute(
                """
                INSERT INTO schedlock_publishes (scheduler, namespace, name, uid, target, due_at,
                    next_attempt_at, state, attempts, max_attempts, term, holder, fired_at)
                VALUES ('publish', 'default', %(uid)s, %(uid)s, 'demo', now(), now(), 'firing',
                        %(attempts)s, 3, 0, 'crashed-leader', now())
                """,
                {"uid": uid, "attempts": attempts},
            )
    group = SidecarGroup(tmp_path, url, replicas=1).start()
    try:
        wait_for(
            lambda: finished(url, "spent") and finished(url, "left"), timeout=30, what="orphans"
        )
        state, attempts, _, error = row(url, "spent")
        assert (state, attempts) == ("failed", 3)
        assert error == (
            "attempt 3 of 3 was cut off: its leader ended during the delivery (crashed or lost "
            "its lease); no attempts left, so it is not fired again"
        )
        assert row(url, "left")[:2] == ("published", 2)
        assert group.receiver is not None
        assert [e["uid"] for e in group.receiver.entries()] == ["left"]
    finally:
        group.stop()


def test_a_row_that_keeps_killing_its_leader_is_quarantined(
    tmp_path: Path, migrated_database: str
) -> None:
    """An app that never answers, and a leader SIGKILLed during each delivery: after
    max_attempts deliveries the next leader ends the row failed instead of firing it again."""
    url = migrated_database
    group = SidecarGroup(
        tmp_path, url, replicas=1, extra_env={"SCHEDLOCK_REQUEST_TIMEOUT_SECONDS": "60"}
    ).start()
    try:
        receiver = group.receiver
        assert receiver is not None
        receiver.control(hang=True)
        insert_rows(url, 1, start_in=0.2, prefix="killer", max_attempts=2)
        for attempt in (1, 2):
            leader = group.wait_leader()

            def in_flight(n: int = attempt) -> bool:
                return len(receiver.entries()) == n

            wait_for(
                in_flight,
                timeout=30,
                what=f"delivery {attempt} in flight",
            )
            assert row(url, "killer-0")[:2] == ("firing", attempt)
            leader.signal(signal.SIGKILL)
            leader.wait(10)
            group.add().wait_ready()
        wait_for(lambda: finished(url, "killer-0"), timeout=30, what="the row to be quarantined")
        state, attempts, _, error = row(url, "killer-0")
        assert (state, attempts) == ("failed", 2)
        assert error is not None and error.startswith("attempt 2 of 2 was cut off")
        time.sleep(0.5)
        assert len(receiver.entries()) == 2, "never delivered a third time"
    finally:
        group.stop()
