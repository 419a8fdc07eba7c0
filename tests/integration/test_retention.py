"""Retention against real databases: what the pruner deletes and keeps, who prunes, and that a
claim never waits for it (``schedlock.store.retention``)."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from schedlock.core.logs import Event, records
from schedlock.store import LockKey, PublishSpec, RecordedOutcome, StoreError, open_store
from schedlock.store.keys import SCHEDLOCK_CLASS_ID
from schedlock.store.retention import PassReport, Pruner, RetentionPolicy, permission_problem
from schedlock.store.rows import iso
from testbed.pg_fixtures import SIDECAR_ROLE, PostgresService, as_role
from testbed.rows import insert_rows
from testbed.sidecars import ReceiverProcess, SidecarGroup, SidecarProcess, wait_for

HOUR = 3600.0
POLICY = RetentionPolicy(retention_seconds=HOUR, failed_retention_seconds=3 * HOUR, batch_size=7)


def add_rows(
    url: str,
    count: int,
    *,
    state: str,
    age: float,
    prefix: str,
    target: str = "demo",
    scheduler: str = "publish",
    schedule_id: int | None = None,
) -> None:
    """``count`` rows in ``state`` whose last change was ``age`` seconds ago (database clock)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            """
            INSERT INTO schedlock_publishes (scheduler, namespace, name, uid, target, due_at,
                next_attempt_at, state, schedule_id, created_at, updated_at, finished_at)
            SELECT %(scheduler)s, 'default', %(prefix)s || i, %(prefix)s || i, %(target)s,
                   now() - make_interval(secs => %(age)s), now() - make_interval(secs => %(age)s),
                   %(state)s, %(schedule_id)s, now() - make_interval(secs => %(age)s),
                   now() - make_interval(secs => %(age)s),
                   CASE WHEN %(state)s IN ('published', 'failed', 'missed', 'cancelled')
                        THEN now() - make_interval(secs => %(age)s) END
            FROM generate_series(1, %(count)s) AS i
            """,
            {
                "scheduler": scheduler,
                "prefix": prefix,
                "target": target,
                "age": age,
                "state": state,
                "count": count,
                "schedule_id": schedule_id,
            },
        )


def count(url: str, sql: str, *params: object) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(sql, params or None).fetchone()
    assert row is not None
    return int(row[0])


def states(url: str, prefix: str) -> int:
    return count(url, "SELECT count(*) FROM schedlock_publishes WHERE uid LIKE %s", prefix + "%")


async def prune(url: str, policy: RetentionPolicy = POLICY, holder: str = "pruner") -> PassReport:
    store = open_store(url)
    try:
        return await Pruner(store, holder, policy).run_once()
    finally:
        await store.close()


async def test_rows_past_retention_go_newer_stay_and_failed_ones_are_kept_longer(
    migrated_database: str,
) -> None:
    url = migrated_database
    for state in ("published", "cancelled", "failed", "missed"):
        add_rows(url, 20, state=state, age=2 * HOUR, prefix=f"old-{state}-")
        add_rows(url, 3, state=state, age=0.5 * HOUR, prefix=f"new-{state}-")
    for state in ("failed", "missed"):
        add_rows(url, 4, state=state, age=4 * HOUR, prefix=f"older-{state}-")
    # A key no sidecar serves any more: its finished rows go like any other.
    add_rows(url, 5, state="published", age=2 * HOUR, prefix="gone-", target="removed-app")
    # Live rows are never pruned, however old.
    for state in ("scheduled", "firing", "suspended"):
        add_rows(url, 2, state=state, age=30 * HOUR, prefix=f"live-{state}-")

    report = await prune(url)

    assert report.won and report.complete
    assert report.deleted["publishes"] == 20 + 20 + 4 + 4 + 5
    assert report.batches > 49 // POLICY.batch_size  # in batches of at most 7
    for state in ("published", "cancelled"):
        assert states(url, f"old-{state}-") == 0
    for state in ("failed", "missed"):
        assert states(url, f"old-{state}-") == 20  # 2 h old: inside their 3 h
        assert states(url, f"older-{state}-") == 0
    for state in ("published", "cancelled", "failed", "missed"):
        assert states(url, f"new-{state}-") == 3
    assert states(url, "gone-") == 0
    for state in ("scheduled", "firing", "suspended"):
        assert states(url, f"live-{state}-") == 2
    assert report.stats is not None
    assert report.stats.published_age_seconds == pytest.approx(0.5 * HOUR, abs=60)
    assert report.stats.failed_age_seconds == pytest.approx(2 * HOUR, abs=60)
    assert report.stats.publishes_bytes and report.stats.publishes_bytes > 8192

    # A retention of 0 keeps that class forever.
    keep_failed = RetentionPolicy(retention_seconds=HOUR, failed_retention_seconds=0)
    add_rows(url, 2, state="failed", age=400 * HOUR, prefix="ancient-")
    assert (await prune(url, keep_failed)).deleted["publishes"] == 0
    assert states(url, "ancient-") == 2


def schedule(url: str, uid: str, state: str, age: float) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "INSERT INTO schedlock_schedules (namespace, name, uid, target, expression, state, "
            "updated_at) VALUES ('default', %s, %s, 'demo', '@every 1m', %s, "
            "now() - make_interval(secs => %s)) RETURNING id",
            (uid, uid, state, age),
        ).fetchone()
    assert row is not None
    return int(row[0])


def slots(url: str, schedule_id: int, n: int, *, state: str, age: float, prefix: str) -> None:
    add_rows(
        url, n, state=state, age=age, prefix=prefix, schedule_id=schedule_id, scheduler="recurring"
    )


async def test_cancelled_schedules_go_with_their_slots_and_live_ones_stay(
    migrated_database: str,
) -> None:
    url = migrated_database
    gone = schedule(url, "gone", "cancelled", 2 * HOUR)
    slots(url, gone, 3, state="cancelled", age=0.1 * HOUR, prefix="gone-slot-")
    recent = schedule(url, "recent", "cancelled", 0.5 * HOUR)
    busy = schedule(url, "busy", "cancelled", 2 * HOUR)
    slots(url, busy, 1, state="firing", age=2 * HOUR, prefix="busy-slot-")
    active = schedule(url, "active", "active", 30 * HOUR)

    report = await prune(url)

    assert report.deleted["schedules"] == 1
    with psycopg.connect(url) as conn:
        left = {int(str(r[0])) for r in conn.execute("SELECT id FROM schedlock_schedules")}
    assert left == {recent, busy, active}
    assert states(url, "gone-slot-") == 0  # the cascade, though they were only 6 min old
    assert states(url, "busy-slot-") == 1  # a schedule with a live slot waits for it


def term(url: str, key: LockKey, heartbeat_age: float | None, term: int = 7) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO schedlock_terms (scheduler, namespace, target, lock_classid, lock_objid, "
            "term, heartbeat_at) VALUES (%s, %s, %s, %s, %s, %s, "
            "now() - make_interval(secs => %s))",
            (key.scheduler, key.namespace, key.target, key.classid, key.objid, term, heartbeat_age),
        )


def terms(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        return {str(r[0]) for r in conn.execute("SELECT target FROM schedlock_terms").fetchall()}


async def test_terms_and_roster_of_gone_keys_go_and_a_live_keys_never(
    migrated_database: str,
) -> None:
    url = migrated_database
    old = 2 * HOUR
    kept = (
        "recent",
        "never-led",
        "with-row",
        "with-suspended",
        "waited-for",
        "held",
        "with-reserve",
    )
    keys = {name: LockKey("publish", "default", name) for name in ("gone", *kept)}
    term(url, keys["gone"], old)
    term(url, keys["recent"], 0.5 * HOUR)
    term(url, keys["never-led"], None, term=0)  # no heartbeat: no age to judge it by
    for name in ("with-row", "with-suspended", "waited-for", "held", "with-reserve"):
        term(url, keys[name], old)
    add_rows(url, 1, state="scheduled", age=old, prefix="r-", target="with-row")
    add_rows(url, 1, state="suspended", age=old, prefix="s-", target="with-suspended")
    recurring = LockKey("recurring", "default", "cron-app")
    term(url, recurring, old)
    schedule_id = schedule(url, "cron", "active", old)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "UPDATE schedlock_schedules SET target = 'cron-app' WHERE id = %s", (schedule_id,)
        )
        conn.execute(
            "INSERT INTO schedlock_reserves (scheduler, namespace, target, holder, "
            "next_check_at, expires_at) VALUES "
            "('publish', 'default', 'with-reserve', 'r1', now() + interval '5 s', "
            "now() + interval '10 s'), "
            "('publish', 'default', 'gone', 'dead', now() - interval '20 s', "
            "now() - interval '10 s')"
        )
    # A standby waiting for a lock, and a leader holding one (whatever its heartbeat says).
    holder = psycopg.connect(url, autocommit=True)
    waiter = psycopg.connect(url, autocommit=True)
    try:
        waited = keys["waited-for"]
        holder.execute("SELECT pg_advisory_lock(%s, %s)", (waited.classid, waited.objid))
        holder.execute(
            "SELECT pg_advisory_lock(%s, %s)", (keys["held"].classid, keys["held"].objid)
        )
        waiter.execute("SET application_name = 'standby'")
        waiting = threading.Thread(
            target=waiter.execute,
            args=("SELECT pg_advisory_lock(%s, %s)", (waited.classid, waited.objid)),
        )
        waiting.start()
        wait_for(
            lambda: (
                count(
                    url, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                )
                == 1
            ),
            5,
            what="the standby waiting",
        )
        report = await prune(url)
    finally:
        holder.close()  # releases both: the standby is granted, then closed
        waiting.join(5)
        waiter.close()

    assert report.deleted["terms"] == 1
    assert report.deleted["reserves"] == 1
    assert terms(url) == {*kept, "cron-app"}
    assert count(url, "SELECT count(*) FROM schedlock_reserves") == 1
    # Keys kept by a reason that is gone now go at the next pass.
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DELETE FROM schedlock_publishes WHERE target = 'with-row'")
    assert (await prune(url)).deleted["terms"] == 3  # with-row, waited-for, held
    assert "with-row" not in terms(url)


async def test_one_contender_prunes_per_interval(migrated_database: str) -> None:
    url = migrated_database
    add_rows(url, 10, state="published", age=2 * HOUR, prefix="a-")
    first = await prune(url, holder="sidecar-a")
    second = await prune(url, holder="operator-b")
    assert first.won and first.deleted["publishes"] == 10
    assert not second.won and second.total == 0
    assert second.lease is not None and second.lease.holder == "sidecar-a"
    assert second.stats is not None  # a loser measures the history all the same
    # The holder keeps the job: its next pass renews its own lease.
    add_rows(url, 4, state="published", age=2 * HOUR, prefix="b-")
    again = await prune(url, holder="sidecar-a")
    assert again.won and again.deleted["publishes"] == 4
    # A holder that stopped coming back is replaced once its lease ran out.
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE schedlock_maintenance SET lease_until = now() - interval '1 s'")
    taken = await prune(url, holder="operator-b")
    assert taken.won and taken.lease is not None and taken.lease.holder == "operator-b"
    assert not (await prune(url, holder="sidecar-a")).won


async def test_concurrent_contenders_elect_one(migrated_database: str) -> None:
    url = migrated_database
    reports = await asyncio.gather(*(prune(url, holder=f"c{i}") for i in range(6)))
    assert sum(r.won for r in reports) == 1


async def test_a_claim_is_never_blocked_by_a_prune_pass(migrated_database: str) -> None:
    """Claims and completions on the lock session go on while a pass deletes 30,000 rows; the
    pass skips a finished row another transaction holds instead of waiting for it."""
    url = migrated_database
    add_rows(url, 30_000, state="published", age=2 * HOUR, prefix="h-")
    key = LockKey("publish", "default", "demo")
    store = open_store(url)
    session = store.lock_session(key, "leader", 10)
    await session.connect()
    await session.acquire()
    started = await session.begin_term()
    blocker = psycopg.connect(url)  # a transaction holding one old finished row's lock
    blocker.execute("SELECT id FROM schedlock_publishes WHERE uid = 'h-1' FOR UPDATE")
    insert_rows(url, 200, start_in=-1.0, spacing=0.0, prefix="due")  # all due already
    policy = RetentionPolicy(retention_seconds=HOUR, batch_size=2000)
    try:
        pruning = asyncio.create_task(Pruner(store, "pruner", policy).run_once())
        claims: list[float] = []
        claimed = 0

        async def prune_sessions() -> int:  # looked at while the pass runs, beside the claims
            await asyncio.sleep(0.1)
            return await asyncio.to_thread(
                count, url, "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                "schedlock-prune",
            )  # fmt: skip

        looking = asyncio.create_task(prune_sessions())
        while not pruning.done():
            t0 = time.perf_counter()
            result = await session.claim_due(started.term, 10)
            claims.append(time.perf_counter() - t0)
            claimed += len(result.rows)
            await asyncio.sleep(0.005)
        report = await pruning
    finally:
        blocker.rollback()
        blocker.close()
        await session.close()
        await store.close()
    assert report.won and report.deleted["publishes"] == 30_000 - 1  # h-1 was skipped
    assert report.batches >= 15 and len(claims) >= 10
    # Every claim while the pass ran got its full batch of due rows (none skipped, none
    # waited for), however fast this machine ran the pass.
    assert claimed == min(200, 10 * len(claims)), (claimed, len(claims))
    # A claim waits for no batch: even the slowest stays far below one batch's statement time.
    assert max(claims) < 0.25, sorted(claims)[-5:]
    assert states(url, "h-") == 1
    assert await looking == 1  # its own session, named for it: never the lock session


async def test_a_role_without_the_pruning_grants_is_told_not_stopped(
    migrated_database: str, postgres: PostgresService
) -> None:
    url = migrated_database
    add_rows(url, 3, state="published", age=2 * HOUR, prefix="g-")
    granted = await prune(as_role(url, SIDECAR_ROLE))  # the grants include the pruner's
    assert granted.won and granted.deleted["publishes"] == 3
    postgres.execute(f'REVOKE DELETE ON schedlock_publishes FROM "{SIDECAR_ROLE}"', url=url)
    add_rows(url, 1, state="published", age=2 * HOUR, prefix="g2-")
    with pytest.raises(StoreError) as refused:
        await prune(as_role(url, SIDECAR_ROLE))
    assert permission_problem(refused.value)
    postgres.execute(f'GRANT DELETE ON schedlock_publishes TO "{SIDECAR_ROLE}"', url=url)


def test_a_sidecar_alone_prunes_what_it_fired(tmp_path: Path, migrated_database: str) -> None:
    """The README's quick start: sidecars and a database, no operator; fired rows go after the
    retention and the metrics say so."""
    url = migrated_database
    group = SidecarGroup(
        tmp_path,
        url,
        replicas=2,
        extra_env={
            "SCHEDLOCK_RETENTION_SECONDS": "2",
            "SCHEDLOCK_FAILED_RETENTION_SECONDS": "2",
            "SCHEDLOCK_PRUNE_INTERVAL_SECONDS": "1",
        },
    ).start()
    try:
        leader = group.wait_leader()
        uids = insert_rows(url, 25, start_in=0.2, spacing=0.01, prefix="q")
        wait_for(
            lambda: (
                count(url, "SELECT count(*) FROM schedlock_publishes WHERE state = 'published'")
                == 25
            ),
            20,
            what="25 rows published",
        )
        assert group.receiver is not None
        wait_for(
            lambda: count(url, "SELECT count(*) FROM schedlock_publishes") == 0,
            30,
            what="the fired rows pruned",
        )
        assert len({e["uid"] for e in group.receiver.entries()}) == len(uids)

        def pruned() -> float:
            return sum(
                s.metrics().get('schedlock_history_pruned_rows_total{table="publishes"}', 0)
                for s in group
            )

        wait_for(lambda: pruned() == 25, 10, what="the pruned rows counted")
        values = leader.metrics()
        assert values['schedlock_history_retention_seconds{state="published"}'] == 2
        assert 'schedlock_history_table_bytes{table="publishes"}' in values
        holder = count(url, "SELECT count(*) FROM schedlock_maintenance WHERE holder IS NOT NULL")
        assert holder == 1
    finally:
        group.stop()


async def test_sqlite_prunes_between_the_firing_loops_statements(tmp_path: Path) -> None:
    path = tmp_path / "schedlock.db"
    url = f"sqlite:///{path}"
    store = open_store(url)
    await store.migrate()
    now = datetime.now(UTC)
    with sqlite3.connect(path) as conn:
        for i, (state, age) in enumerate(
            [("published", 2 * HOUR)] * 30
            + [("failed", 2 * HOUR)] * 5
            + [("published", 60.0)] * 4
            + [("scheduled", 9 * HOUR)] * 2
        ):
            stamp = iso(now - timedelta(seconds=age))
            conn.execute(
                "INSERT INTO schedlock_publishes (namespace, name, uid, target, due_at, "
                "next_attempt_at, state, created_at, updated_at) VALUES "
                "('default', ?, ?, 'demo', ?, ?, ?, ?, ?)",
                (f"r{i}", f"r{i}", stamp, stamp, state, stamp, stamp),
            )
        conn.execute(
            "INSERT INTO schedlock_terms (scheduler, namespace, target, lock_classid, "
            "lock_objid, term, heartbeat_at) VALUES ('publish', 'default', 'gone', ?, 1, 3, ?)",
            (SCHEDLOCK_CLASS_ID, iso(now - timedelta(seconds=2 * HOUR))),
        )
    session = store.lock_session(LockKey("publish", "default", "demo"), "sqlite", 10)
    await session.connect()
    started = await session.begin_term()
    try:
        pruning = asyncio.create_task(Pruner(store, "local", POLICY).run_once())
        claims = 0
        while not pruning.done():
            await session.claim_due(started.term, 10)  # interleaves with the batches
            claims += 1
            await asyncio.sleep(0)
        report = await pruning
    finally:
        await session.close()
        await store.close()
    assert report.won and report.complete
    assert report.deleted == {"publishes": 30, "schedules": 0, "terms": 1, "reserves": 0}
    assert claims >= 2
    assert report.stats is not None and report.stats.publishes_bytes is None
    with sqlite3.connect(path) as conn:
        left = dict(conn.execute("SELECT state, count(*) FROM schedlock_publishes GROUP BY state"))
        assert left == {"failed": 5, "published": 4, "firing": 2}  # the old scheduled ones fired
        targets = {r[0] for r in conn.execute("SELECT target FROM schedlock_terms")}
    assert targets == {"demo"}


@pytest.mark.parametrize("dialect", ["postgres", "sqlite"])
async def test_a_new_generation_keeps_its_recorded_outcome_pruned_or_not(
    dialect: str, migrated_database: str, tmp_path: Path
) -> None:
    """The upsert handler's ``keep`` (a payload edit after firing): the row keeps the outcome
    the status records whatever became of it, and never becomes due."""
    url = migrated_database if dialect == "postgres" else f"sqlite:///{tmp_path / 'k.db'}"
    store = open_store(url)
    await store.migrate()
    due = datetime(2030, 1, 1, tzinfo=UTC)
    outcome = RecordedOutcome("published", attempts=1, term=3, holder="pod-a")

    def spec(uid: str, generation: int) -> PublishSpec:
        return PublishSpec(
            namespace="default", name=uid, uid=uid, target="demo", due_at=due,
            generation=generation, payload={"v": generation},
        )  # fmt: skip

    try:
        # Pruned: stored in its outcome, at the new generation.
        kept = await store.restore_publish(spec("pruned", 2), outcome)
        assert kept.inserted and kept.state == "published"
        # Finished: only the spec moves on.
        await store.restore_publish(spec("done", 1), RecordedOutcome("failed", attempts=3))
        assert (await store.restore_publish(spec("done", 2), outcome)).state == "failed"
        # Back in scheduled (a restore): put back in the outcome.
        await store.upsert_publish(spec("back", 1))
        assert (await store.restore_publish(spec("back", 2), outcome)).state == "published"
        # A replay changes nothing.
        assert (await store.restore_publish(spec("back", 2), outcome)).id is None
        for uid, state in (("pruned", "published"), ("done", "failed"), ("back", "published")):
            record = await store.get_publish(uid)
            assert record is not None
            assert (record.state, record.generation, record.payload) == (state, 2, {"v": 2})
    finally:
        await store.close()


def test_a_sqlite_sidecar_prunes_what_it_fired(tmp_path: Path) -> None:
    """Development mode: one `schedlock sidecar` on SQLite fires its rows, then prunes them."""
    path = tmp_path / "dev.db"
    url = f"sqlite:///{path}"
    receiver = ReceiverProcess(tmp_path / "rx").start()
    sidecar = SidecarProcess.for_app(
        "solo",
        tmp_path,
        url,
        receiver.url,
        SCHEDLOCK_RETENTION_SECONDS="1",
        SCHEDLOCK_PRUNE_INTERVAL_SECONDS="1",
    ).start()

    def rows() -> int:
        with sqlite3.connect(path) as conn:
            return int(conn.execute("SELECT count(*) FROM schedlock_publishes").fetchone()[0])

    try:
        sidecar.wait_ready()
        for i in range(4):
            done = subprocess.run(
                [str(Path(sys.executable).parent / "schedlock"), "publish", "--target", "demo",
                 "--at", f"+{0.2 + i * 0.1:.1f}s"],
                env={"SCHEDLOCK_DATABASE_URL": url, "PATH": "/usr/bin:/bin"},
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
        wait_for(lambda: len(receiver.entries()) == 4, 15, what="4 fires")
        wait_for(lambda: rows() == 0, 20, what="the fired rows pruned")
        pruned = 'schedlock_history_pruned_rows_total{table="publishes"}'
        # Counted as each batch commits.
        wait_for(lambda: sidecar.metrics().get(pruned) == 4, 10, what="4 pruned rows counted")
        # The pruner never takes the term of a key the process leads (its heartbeat is older
        # than this 1 s retention between beats): leadership was never lost to it.
        assert not list(records(sidecar.log_text(), Event.LOCK_SESSION_LOST))
    finally:
        sidecar.stop()
        receiver.stop()


def test_prune_batches_read_one_index_range(migrated_database: str) -> None:
    """With history (published rows past and inside the retention, as many failed ones inside
    theirs), a batch and the oldest-row measure use their state's own index, never a scan of
    the table nor a walk of the updated_at index over rows of other states.  The pass's session
    never prepares statements, so each batch is planned with its own values (a generic plan,
    with the state a parameter, can pick the updated_at index and walk the failed rows)."""
    from schedlock.store.queries import load

    queries = load("postgres")

    url = migrated_database
    add_rows(url, 20_000, state="published", age=2 * HOUR, prefix="p-")
    add_rows(url, 20_000, state="published", age=0.1 * HOUR, prefix="n-")
    add_rows(url, 20_000, state="failed", age=2 * HOUR, prefix="f-")
    add_rows(url, 200, state="scheduled", age=-HOUR, prefix="s-")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ANALYZE schedlock_publishes")
        plans = [
            "\n".join(str(r[0]) for r in conn.execute("EXPLAIN " + sql, params))
            for sql, params in (
                (queries["prune_publishes"], {
                    "state": "published", "cutoff": datetime.now(UTC) - timedelta(hours=1),
                    "limit": 1000,
                }),
                (queries["history_stats"], {}),
            )
        ]  # fmt: skip
    for plan in plans:
        assert "schedlock_publishes_published_age" in plan, plan
        assert "Seq Scan on schedlock_publishes" not in plan, plan
        assert "schedlock_publishes_finished" not in plan, plan
