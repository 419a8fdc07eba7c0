"""Upgrade from the oldest supported release and roll back to it, old and new sidecars mixed.

The path docs/operations.md ("Tested upgrade path") promises, run as an operator would on a real
PostgreSQL with real sidecar processes of both versions on the same lock keys:

1. the old release (testbed.releases.OLDEST_SUPPORTED) migrates an empty database to its schema
   and three of its sidecars fire a steady stream of one-shot rows and a recurring schedule;
2. today's ``schedlock migrate`` runs while they fire: they keep firing on the newer schema
   (its migrations are additive), which the old binary itself would refuse to start on;
3. the old sidecars are replaced one by one with today's (a standby by SIGTERM, the leader by
   SIGTERM, the next leader by SIGKILL), each new one started before its old one goes;
4. checked at the end over everything: every row delivered, a second delivery only of a row the
   SIGKILLed leader had in flight and with the same Idempotency-Key, one holder per term and the
   terms of a key's deliveries never going back (two leaders of a key would interleave them);
5. the rollback: today's sidecars stop, today's ``schedlock migrate --to <old schema>`` takes the
   schema down, and the old binary's sidecars lead again and fire what was published before the
   rollback and after it.
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from schedlock.core.identities import Scheduler, scheduler_of
from schedlock.store.migrations import latest_id
from testbed.checks import assert_duplicates_only_across_crash, assert_one_leader_at_a_time
from testbed.pg_fixtures import SIDECAR_ROLE, PostgresService, as_role
from testbed.procs import output
from testbed.releases import Release
from testbed.rows import fetch, insert_rows
from testbed.sidecars import SidecarGroup, SidecarProcess, wait_for

NEW = str(Path(sys.executable).with_name("schedlock"))  # this checkout's console script
# Both releases read these variables; a short lease keeps a SIGKILLed leader's keys short-lived.
ENV = {
    "SCHEDLOCK_LEASE_SECONDS": "4",
    "SCHEDLOCK_HEARTBEAT_SECONDS": "1",
    "SCHEDLOCK_MIGRATE": "off",  # the schema is changed by `schedlock migrate` only
}
EVERY = "@every 1s"
Entry = dict[str, Any]


class RowStream:
    """One-shot rows inserted every quarter second, due just after, until stopped: a steady
    stream whatever each phase lasts.  Records when each row was published (host clock)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.published: dict[str, float] = {}
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="row-stream", daemon=True)

    def start(self) -> RowStream:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            for batch in itertools.count():
                if self._stop.wait(0.25):
                    return
                at = time.time()
                for uid in insert_rows(self.url, 3, start_in=0.2, spacing=0.05, prefix=f"s{batch}"):
                    self.published[uid] = at
        except BaseException as exc:  # surfaced by stop(): a dead stream must fail the test
            self.error = exc

    def halt(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)

    def stop(self) -> set[str]:
        """Stop; the uids published (a stream that failed fails the test)."""
        self.halt()
        assert self.error is None, f"the row stream failed: {self.error!r}"
        return set(self.published)


def run(program: str, url: str, *args: str) -> str:
    """One ``schedlock`` command of either release against ``url``: its stdout."""
    env = {**os.environ, "SCHEDLOCK_DATABASE_URL": url}
    return output([program, *args], f"schedlock {' '.join(args)}", env=env)


def schema(url: str) -> int:
    return int(fetch(url, "SELECT max(id) FROM schedlock_migrations")[0][0])


def leading(program: str, url: str) -> dict[str, str]:
    """Per scheduler of target demo, the version (name prefix) of the sidecar holding the key's
    lock, as ``schedlock status`` of that release tells it."""
    rows = json.loads(run(program, url, "status", "--json"))
    return {r["scheduler"]: str(r["leader"]).split("-")[0] for r in rows if r["target"] == "demo"}


def deliveries(group: SidecarGroup) -> list[Entry]:
    assert group.receiver is not None
    return group.receiver.entries()


def fired(
    group: SidecarGroup, scheduler: Scheduler, holders: str, since: float = 0.0
) -> list[Entry]:
    """Deliveries of ``scheduler``'s key by sidecars named ``holders``-…, arrived after ``since``."""
    return [
        e
        for e in deliveries(group)
        if scheduler_of(str(e["uid"])) is scheduler
        and str(e["holder"]).startswith(holders + "-")
        and float(e["arrival"]) > since
    ]


def wait_fired(group: SidecarGroup, holders: str, since: float, rows: int = 10) -> None:
    """Both keys firing: ``rows`` one-shot deliveries and a slot by ``holders``-… after ``since``."""
    for scheduler, count in ((Scheduler.PUBLISH, rows), (Scheduler.RECURRING, 1)):

        def enough(s: Scheduler = scheduler, c: int = count) -> bool:
            return len(fired(group, s, holders, since)) >= c

        wait_for(
            enough,
            timeout=30,
            what=f"{scheduler} deliveries by the {holders} sidecars",
        )


def old_fleet_firing(group: SidecarGroup, old: str, url: str, stream: RowStream, name: str) -> None:
    """Three sidecars of the ``old`` release ready, its schedule ``name`` and the row stream
    firing through them."""
    for i in range(3):
        group.add(f"old-{i}", program=old)
    for sidecar in group:
        sidecar.wait_ready()
    run(old, url, "schedule", "--target", "demo", "--cron", EVERY, "--name", name)
    stream.start()
    wait_fired(group, "old", since=0.0)


def in_flight(group: SidecarGroup, leader: SidecarProcess) -> None:
    """Make the app slow (it answers after half a second) until ``leader`` has deliveries in
    flight: killed now, it leaves them ``firing`` for the next term to fire again."""
    assert group.receiver is not None
    group.receiver.control(delay=0.5)
    since = time.time()
    wait_for(
        lambda: any(
            e["holder"] == leader.name and float(e["arrival"]) > since for e in deliveries(group)
        ),
        timeout=10,
        what=f"a delivery of {leader.name} in flight",
    )


def roll_over(group: SidecarGroup, killed: set[str]) -> float:
    """Replace the old sidecars with today's, a new one up before each old one goes: a standby
    (SIGTERM), the leader (SIGTERM), then the next leader (SIGKILL, added to ``killed``: its
    in-flight rows are fired again by the next term, new or old, with the same idempotency
    key).  When it is done: the time, and the SIGKILLed leader's rows in flight fired again."""
    for step, sig in enumerate((signal.SIGTERM, signal.SIGTERM, signal.SIGKILL)):
        group.add(f"new-{step}").wait_ready()
        leader = group.wait_leader(Scheduler.PUBLISH)
        olds = [s for s in group if s.alive() and s.name.startswith("old-")]
        # The lock queue is FIFO and the old sidecars joined it first, so after the first
        # step the leader is old; should it not be, an old standby goes instead.
        victim = leader if step and leader in olds else next(s for s in olds if s is not leader)
        crashed_leading = sig is signal.SIGKILL and victim is leader
        if crashed_leading:
            in_flight(group, victim)
        signalled_at = time.time()
        victim.signal(sig)
        if sig is signal.SIGKILL:
            killed.add(victim.name)
            victim.wait()
            assert group.receiver is not None
            group.receiver.control(delay=0)
        else:
            assert victim.wait(15) == 0, victim.log_text()[-2000:]

        def by_the_next(t: float = signalled_at, v: str = victim.name) -> bool:
            return any(e["holder"] != v and float(e["arrival"]) > t for e in deliveries(group))

        wait_for(
            by_the_next,
            timeout=20,
            what=f"deliveries by the next leader after {victim.name}",
        )
    replaced_at = time.time()
    if crashed_leading:
        wait_for(
            lambda: max(collections.Counter(str(e["uid"]) for e in deliveries(group)).values()) > 1,
            timeout=20,
            what="the SIGKILLed leader's rows in flight fired again",
        )
    return replaced_at


# The first run on a machine also builds the old release in its fixture (one to three minutes).
@pytest.mark.timeout(600)
def test_upgrade_from_the_oldest_release_and_roll_back(
    tmp_path: Path,
    database: str,
    runtime_roles: tuple[str, str],
    oldest_release: Release,
) -> None:
    old, old_schema = oldest_release.schedlock, oldest_release.schema
    sidecar_role = runtime_roles[0]
    group = SidecarGroup(tmp_path, as_role(database, sidecar_role), extra_env=ENV, replicas=0)
    group.start()
    stream = RowStream(database)
    killed: set[str] = set()
    try:
        # 1. The old release's schema, migrated by the old binary; its sidecars fire.
        run(old, database, "migrate", "--grant-sidecar", sidecar_role)
        assert schema(database) == old_schema
        old_fleet_firing(group, old, database, stream, "tick")

        # 2. Today's migrate while they fire; they go on, on a schema the old binary refuses.
        applied = run(NEW, database, "migrate", "--grant-sidecar", sidecar_role)
        migrated_at = time.time()
        assert schema(database) == latest_id("postgres") > old_schema, applied
        refused = subprocess.run(
            [old, "migrate"],  # (its sidecars check at start too; its `status` does not)
            env={**os.environ, "SCHEDLOCK_DATABASE_URL": database},
            capture_output=True,
            text=True,
            check=False,
        )
        assert refused.returncode == 1, refused
        assert f"knows only up to {old_schema}" in refused.stderr, refused.stderr
        wait_fired(group, "old", since=migrated_at)

        # 3. Rolling replacement, a new sidecar up before each old one goes.
        replaced_at = roll_over(group, killed)
        wait_fired(group, "new", since=replaced_at)
        assert leading(NEW, database) == dict.fromkeys(Scheduler, "new")

        # 5. Rollback: today's sidecars stop, today's binary takes the schema down, the old
        # binary leads again.  The stream goes on throughout: rows published while nothing
        # runs are fired late by the old binary.
        news = [s for s in group if s.alive()]
        for sidecar in news:
            sidecar.signal(signal.SIGTERM)
        for sidecar in news:
            assert sidecar.wait(15) == 0, sidecar.log_text()[-2000:]
        stopped_at = time.time()
        run(NEW, database, "migrate", "--to", str(old_schema))
        rolled_back_at = time.time()
        assert schema(database) == old_schema
        for i in range(3):
            group.add(f"back-{i}", program=old)
        for sidecar in group:
            if sidecar.alive():
                sidecar.wait_ready()
        restarted_at = time.time()
        wait_fired(group, "back", since=restarted_at)
        assert leading(old, database) == dict.fromkeys(Scheduler, "back")
        uids = stream.stop()
        check_everything(group, database, uids, killed)
        # Rows published with the new schema still in place (no sidecar running), then fired by
        # the old binary once it was back.
        before = {u for u, at in stream.published.items() if stopped_at < at < rolled_back_at}
        assert before, "no row was published between the new sidecars' stop and the rollback"
        assert {version(e) for e in deliveries(group) if e["uid"] in before} == {"back"}
    finally:
        stream.halt()
        group.stop()


def version(entry: Entry) -> str:
    """old, new or back (the old release after the rollback): the holder's name prefix."""
    return str(entry["holder"]).split("-")[0]


def check_everything(
    group: SidecarGroup,
    url: str,
    uids: set[str],
    killed: set[str],
    versions: frozenset[str] = frozenset({"old", "new", "back"}),
) -> None:
    """Step 4, over every delivery: nothing lost, duplicates only across the SIGKILL, one
    leader of a key at a time; both keys fired by the old sidecars, the new ones and the old
    ones back after the rollback."""

    def unfinished() -> list[tuple[Any, ...]]:
        # Every one-shot row (all due by now) and every slot a moment old: all published.
        return fetch(
            url,
            "SELECT uid, state FROM schedlock_publishes WHERE state <> 'published' "
            "AND (scheduler = 'publish' OR due_at < now() - interval '2 seconds')",
        )

    try:
        wait_for(lambda: not unfinished(), timeout=30, what="every due row published")
    except TimeoutError:
        raise AssertionError(f"due rows not published: {unfinished()[:10]}") from None
    # Published rows first: the app records a delivery before it answers, and a row is
    # published only after the answer, so every row read here is in the log read next (the
    # schedule goes on firing in between).
    published = fetch(url, "SELECT uid FROM schedlock_publishes WHERE state = 'published'")
    entries = deliveries(group)
    delivered = {str(e["uid"]) for e in entries}
    assert uids <= delivered, f"{len(uids - delivered)} streamed rows never delivered"
    assert {str(r[0]) for r in published} <= delivered, "a row published without a delivery"
    for scheduler in Scheduler:
        mine = [e for e in entries if scheduler_of(str(e["uid"])) is scheduler]
        assert {version(e) for e in mine} == versions, scheduler
    assert_duplicates_only_across_crash(entries, crashed=killed)
    assert_one_leader_at_a_time(entries)
    terms = dict(fetch(url, "SELECT scheduler, term FROM schedlock_terms WHERE target = 'demo'"))
    for scheduler in Scheduler:
        seen = [int(e["term"]) for e in entries if scheduler_of(str(e["uid"])) is scheduler]
        assert terms[str(scheduler)] >= max(seen), (terms, scheduler)


def test_a_fresh_install_in_its_schema_rolls_back_to_the_oldest_release(
    tmp_path: Path,
    postgres: PostgresService,
    runtime_roles: tuple[str, str],
    oldest_release: Release,
) -> None:
    """An install this release made (in schema ``schedlock``) rolled back to a release that
    names tables unqualified and never sets a search_path, as docs/operations.md's rollback
    steps say: the schema taken down, then each role's search_path put on the schema in the
    database (``ALTER ROLE … IN DATABASE … SET search_path``); the old sidecars then fire the
    rows published before.  The database's own path is PostgreSQL's default here, so nothing
    else finds the schema for the old binary (without the step it sees no schedlock tables)."""
    old, old_schema = oldest_release.schedlock, oldest_release.schema
    database = postgres.create_database()
    name = database.rsplit("/", 1)[1]
    postgres.execute(f'ALTER DATABASE "{name}" SET search_path = "$user", public')
    sidecar_role = runtime_roles[0]
    run(NEW, database, "migrate", "--grant-sidecar", sidecar_role)
    assert fetch(database, "SELECT to_regnamespace('schedlock') IS NOT NULL") == [(True,)]
    run(NEW, database, "migrate", "--to", str(old_schema))
    run(NEW, database, "publish", "--target", "demo", "--name", "before-rollback", "--at", "+1s")
    sidecar_url = as_role(database, sidecar_role)
    assert fetch(sidecar_url, "SELECT to_regclass('schedlock_publishes')") == [(None,)]
    for role in ("postgres", sidecar_role):
        postgres.execute(f'ALTER ROLE "{role}" IN DATABASE "{name}" SET search_path = schedlock')
    group = SidecarGroup(tmp_path, sidecar_url, extra_env=ENV, replicas=0).start()
    try:
        group.add("back-0", program=old).wait_ready()
        published = "SELECT state FROM schedlock.schedlock_publishes WHERE name = 'before-rollback'"
        wait_for(
            lambda: fetch(database, published) == [("published",)],
            timeout=30,
            what="the old release to fire the row published before the rollback",
        )
        assert [str(e["holder"]) for e in deliveries(group)] == ["back-0"]
    finally:
        group.stop()
        for role in ("postgres", sidecar_role):
            postgres.execute(f'ALTER ROLE "{role}" IN DATABASE "{name}" RESET search_path')
        postgres.drop_database(database)


@pytest.mark.timeout(600)
def test_a_rolling_update_from_sessions_per_key_to_one_session_per_sidecar(
    tmp_path: Path,
    migrated_database: str,
    per_key_release: Release,
) -> None:
    """The release before one session per sidecar (each key's lock waited for on a session of
    its own) and today's (a target's leadership lock, then each key's own on the same session)
    on the same keys while rows and a schedule fire: each key has one leader at a time, old or
    new, a new leader takes the keys as the old replicas go, nothing is lost, and a second
    delivery is only of the SIGKILLed leader's rows in flight, with the same key."""
    old = per_key_release.schedlock
    sidecar_url = as_role(migrated_database, SIDECAR_ROLE)
    group = SidecarGroup(tmp_path, sidecar_url, extra_env=ENV, replicas=0)
    group.start()
    stream = RowStream(migrated_database)
    killed: set[str] = set()
    try:
        old_fleet_firing(group, old, migrated_database, stream, "t")
        replaced_at = roll_over(group, killed)
        wait_fired(group, "new", since=replaced_at)
        assert leading(NEW, migrated_database) == dict.fromkeys(Scheduler, "new")
        # One session per new sidecar: the leader holds both keys on one, a standby waits on
        # one, the third is a reserve with none (but for a moment at each of its turns, every
        # 5 s, as a leader's pruning pass has one of its own): awaited, not one snapshot.
        news = [s.name for s in group if s.alive()]
        samples: list[list[int]] = []

        def settled_on_one_each() -> bool:
            rows = dict(
                fetch(
                    migrated_database,
                    "SELECT application_name, count(*) FROM pg_stat_activity "
                    "WHERE application_name = ANY(%s) GROUP BY application_name",
                    news,
                )
            )
            samples.append(sorted(int(rows.get(name, 0)) for name in news))
            return samples[-1] == [0, 1, 1]

        try:
            wait_for(settled_on_one_each, timeout=15, interval=0.2, what="one session each")
        except TimeoutError:
            raise AssertionError(f"sessions per new sidecar: {samples[-10:]}") from None
        uids = stream.stop()
        check_everything(group, migrated_database, uids, killed, frozenset({"old", "new"}))
    finally:
        stream.halt()
        group.stop()
