"""Scale across targets: many apps' sidecars on one database next to an app's pool.

The issue's cluster: ``scale_targets_count`` targets (50) × ``scale_targets_replicas`` (2)
real ``schedlock sidecar`` processes, every default, on one database of a PostgreSQL of its own
with ``max_connections`` = ``scale_targets_max_connections`` (150), next to an app pool of
``scale_targets_app_pool`` (40) idle connections of a non-superuser role ``app``, opened
first as an app's pool would be. The sidecars run as the server's superuser, as in the other
scenarios (schedlock gives a reserved slot back by itself). One shared receiver takes every
target's deliveries; the rows of a trial are told apart by their uid prefix.

Everything is counted from the server, never from what the design promises, so the scenario
measures whatever the code does (one session per key or one per sidecar):

* sessions held by the sidecars, in ``pg_stat_activity`` (``application_name`` is the
  sidecar's holder name ``tNN-rK``, which attributes each session to its target): total and
  per target, ``SAMPLES`` samples once the count has settled; the ordinary slots left
  (``max_connections`` − ``superuser_reserved_connections`` − ``reserved_connections`` −
  every client session) and whether the app can open one more connection;
* keys led (the sidecars' ``schedlock_leader`` gauges) and targets with a standby (a session
  of the target waiting on an advisory lock);
* new connections/s and statements/s over a quiet window (``pg_stat_database.sessions``,
  ``xact_commit``), connections refused (the sidecars'
  ``schedlock_database_connections_refused_total``: in all and within the window);
* SIGKILL of a key's leader, its standby alive: rows of one target due every 10 ms, the
  ``publish`` leader SIGKILLed, the gap at the receiver between the last delivery before the
  kill and the first by another replica; each trial on another target (whether that key had a
  session waiting on the victim's lock at the kill is recorded); a replacement replica is
  started after the trial, as a Deployment would;
* SIGKILL of a target's leader *and* its standby: with 2 replicas that is both, and no replica
  of the target is left, so two fresh ones are started at the moment of the kill (a ReplicaSet
  replacing its pods, at best at once): the gap from the last delivery before the kill to the
  first by a replacement — a process start, the app check's success threshold, a connection
  and the lock included. (With a third replica that is a reserve, the reserve's turn would
  bound it instead: ``SCHEDLOCK_RESERVE_CHECK_SECONDS`` × 1.1 plus a connection, measured by
  tests/e2e/test_connection_budget.py.)
* the figure for 100 × 3 and 1,000 × 3: before the fleet starts, target ``t00`` runs 3
  replicas alone (next to the app pool) and its sessions are counted; the sizing rule
  (sessions = targets × per-target sessions at 3 replicas + the operator's) gives the rest
  (:func:`sessions_needed`). Its third replica then stops, and the fleet starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import psycopg

from bench.context import Context
from bench.rows import insert_due
from bench.stats import summarize
from bench.systems import rss_mb, until
from testbed.deliveries import DeliveryLog
from testbed.pg import PostgresServer
from testbed.sidecars import ReceiverProcess, SidecarProcess

SAMPLES = 10
APP_ROLE = "app"
DBNAME = "fleet"
REFUSED = "schedlock_database_connections_refused_total"
SCHEDULERS = ("publish", "recurring")
# The operator's sessions in the sizing rule (docs/operations.md, "The connection budget"):
# its pool of 4, its LISTEN session and the status sync's lock.
OPERATOR_SESSIONS = 6
SIZES = ((100, 3), (1000, 3))  # (targets, replicas) the figure is computed for
HOLDER = re.compile(r"^(t\d+)-r\d+(?:$|-)")
# Longest wait for a successor's first delivery (then censored): past a refused replica's
# longest back-off (60 s plus jitter).
SUCCESSOR_CAP_S = 75.0


# -- pure parts ----------------------------------------------------------------------------


def target_name(index: int) -> str:
    return f"t{index:02d}"


def target_of(application_name: str) -> str | None:
    """The target of a sidecar's session from its ``application_name`` (the holder name
    ``tNN-rK``, or a name derived from it such as ``tNN-rK-probe1``); None for any other."""
    match = HOLDER.match(application_name)
    return match.group(1) if match else None


def per_target_counts(names: Iterable[str], targets: Sequence[str]) -> tuple[dict[str, int], int]:
    """Sessions per target (every target listed, 0 if none) and the sessions of no target."""
    counts = dict.fromkeys(targets, 0)
    other = 0
    for name in names:
        target = target_of(name)
        if target in counts:
            counts[target] += 1
        else:
            other += 1
    return counts, other


def sessions_needed(targets: int, per_target: float, operator: int = OPERATOR_SESSIONS) -> int:
    """The sizing rule: sessions = targets × sessions per target + the operator's."""
    return round(targets * per_target) + operator


def spread(items: Sequence[str], n: int) -> list[str]:
    """``n`` items picked evenly along ``items`` (all of them if fewer)."""
    if n >= len(items):
        return list(items)
    return [items[i * len(items) // n] for i in range(n)]


def free_slots(max_connections: int, reserved: int, client_sessions: int) -> int:
    """Ordinary connection slots left: what a non-superuser (the app) can still open."""
    return max_connections - reserved - client_sessions


# -- the fleet -----------------------------------------------------------------------------


class Fleet:
    """The scenario's server, database, app pool, receiver and sidecars."""

    def __init__(self, ctx: Context) -> None:
        p = ctx.profile
        self.ctx = ctx
        self.workdir = ctx.env.workdir / "scale_targets"
        self.server = PostgresServer(
            self.workdir / "postgres",
            settings={"max_connections": str(p.scale_targets_max_connections)},
        )
        self.targets = [target_name(i) for i in range(p.scale_targets_count)]
        self.sidecars: dict[str, list[SidecarProcess]] = {t: [] for t in self.targets}
        self.started: dict[str, int] = dict.fromkeys(self.targets, 0)
        self.app_pool: list[psycopg.Connection[tuple[Any, ...]]] = []
        self.receiver: ReceiverProcess | None = None
        self.log: DeliveryLog | None = None
        self._admin: psycopg.Connection[tuple[Any, ...]] | None = None
        self.url = ""

    # lifecycle

    def start(self) -> None:
        self.server.start()
        self.sql(f'CREATE DATABASE "{DBNAME}"')
        self.sql(f'CREATE ROLE "{APP_ROLE}" LOGIN')  # not a superuser: ordinary slots only
        self.url = self.server.url(DBNAME)
        subprocess.run(
            [str(Path(sys.executable).parent / "schedlock"), "migrate"],
            env={**os.environ, "SCHEDLOCK_DATABASE_URL": self.url},
            check=True,
            capture_output=True,
        )
        app_url = self.server.url(DBNAME, user=APP_ROLE)
        for _ in range(self.ctx.profile.scale_targets_app_pool):
            self.app_pool.append(psycopg.connect(app_url, autocommit=True))
        self.receiver = ReceiverProcess(self.workdir / "receiver").start()
        self.log = DeliveryLog(self.receiver.log_path)

    def stop(self) -> None:
        everyone = [s for group in self.sidecars.values() for s in group]
        for sidecar in everyone:
            sidecar.signal(signal.SIGTERM)
        for sidecar in everyone:
            sidecar.stop()
        if self.receiver is not None:
            self.receiver.stop()
        for conn in [*self.app_pool, *([self._admin] if self._admin else [])]:
            with contextlib.suppress(psycopg.Error):
                conn.close()
        self.server.destroy()

    def add(self, target: str) -> SidecarProcess:
        assert self.receiver is not None
        env = {
            "SCHEDLOCK_DATABASE_URL": self.url,
            "SCHEDLOCK_TARGET": target,
            "SCHEDLOCK_TARGET_URL": self.receiver.url,
            "SCHEDLOCK_LOG_FORMAT": "json",
            **self.ctx.profile.timings.schedlock_env(),
        }
        name = f"{target}-r{self.started[target]}"
        self.started[target] += 1
        sidecar = SidecarProcess(name, self.workdir / "sidecars", env).start()
        self.sidecars[target].append(sidecar)
        return sidecar

    def alive(self) -> list[SidecarProcess]:
        return [s for group in self.sidecars.values() for s in group if s.alive()]

    # the server's view

    def sql(self, query: str, params: tuple[Any, ...] | None = None) -> list[tuple[Any, ...]]:
        if self._admin is None or self._admin.closed:
            self._admin = psycopg.connect(self.server.url(), autocommit=True)
        cur = self._admin.execute(query.encode(), params)
        return cur.fetchall() if cur.description else []

    def sidecar_sessions(self) -> list[str]:
        """The application_name of every client session on the database but the app's."""
        rows = self.sql(
            "SELECT application_name FROM pg_stat_activity WHERE datname = %s "
            "AND backend_type = 'client backend' AND usename <> %s",
            (DBNAME, APP_ROLE),
        )
        return [str(name) for (name,) in rows]

    def client_sessions(self) -> int:
        """Every client session on the server (any database, any role)."""
        rows = self.sql(
            "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'"
        )
        return int(rows[0][0])

    def reserved_slots(self) -> int:
        rows = self.sql(
            "SELECT current_setting('superuser_reserved_connections')::int "
            "+ COALESCE(current_setting('reserved_connections', true), '0')::int"
        )
        return int(rows[0][0])

    def counters(self) -> tuple[int, int]:
        """(sessions established, transactions committed) of the database so far."""
        row = self.sql(
            "SELECT sessions, xact_commit FROM pg_stat_database WHERE datname = %s", (DBNAME,)
        )[0]
        return int(row[0]), int(row[1])

    def targets_with_standby(self) -> int:
        """Targets with a session waiting on an advisory lock (a standby)."""
        rows = self.sql(
            "SELECT DISTINCT a.application_name FROM pg_locks l "
            "JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.locktype = 'advisory' AND NOT l.granted AND a.datname = %s",
            (DBNAME,),
        )
        return len({target_of(str(name)) for (name,) in rows} - {None})

    def waiters_on(self, holder: str) -> int:
        """Sessions waiting on an advisory lock that ``holder``'s session is granted."""
        rows = self.sql(
            "SELECT count(*) FROM pg_locks w JOIN pg_locks h ON w.locktype = 'advisory' "
            "AND h.locktype = 'advisory' AND w.database = h.database AND w.classid = h.classid "
            "AND w.objid = h.objid AND w.objsubid = h.objsubid "
            "JOIN pg_stat_activity a ON a.pid = h.pid "
            "WHERE NOT w.granted AND h.granted AND (a.application_name = %s "
            "OR a.application_name LIKE %s)",
            (holder, holder + "-%"),
        )
        return int(rows[0][0])

    def app_can_connect(self) -> bool:
        """Whether the app (a non-superuser) can open one more connection now."""
        try:
            with psycopg.connect(self.server.url(DBNAME, user=APP_ROLE), connect_timeout=5):
                return True
        except psycopg.OperationalError:
            return False

    # the sidecars' view

    def leaders(self) -> dict[tuple[str, str], int]:
        """(target, scheduler) -> how many live sidecars say they lead it."""
        led: dict[tuple[str, str], int] = {}
        for target, group in self.sidecars.items():
            for sidecar in group:
                if not sidecar.alive():
                    continue
                for key, value in sidecar.metrics().items():
                    if key.startswith("schedlock_leader{") and value == 1:
                        for scheduler in SCHEDULERS:
                            if f'scheduler="{scheduler}"' in key:
                                led[(target, scheduler)] = led.get((target, scheduler), 0) + 1
        return led

    def refused(self) -> int:
        return int(sum(s.metrics().get(REFUSED, 0) for s in self.alive()))

    def publish_leader(self, target: str) -> SidecarProcess | None:
        return next((s for s in self.sidecars[target] if s.alive() and s.leads("publish")), None)


# -- steps ---------------------------------------------------------------------------------


async def _stable_sessions(fleet: Fleet, cap_s: float) -> None:
    """Wait until the sidecars' session count holds still for 3 s (or ``cap_s`` passed)."""
    deadline = time.monotonic() + cap_s
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        count = len(fleet.sidecar_sessions())
        if count != last:
            last, since = count, time.monotonic()
        elif time.monotonic() - since >= 3.0:
            return
        await asyncio.sleep(0.5)
    fleet.ctx.say(f"scale_targets: sessions still moving after {cap_s:g} s ({last})")


async def _calibrate(fleet: Fleet) -> dict[str, Any]:
    """Target t00 with 3 replicas alone next to the app pool: its sessions."""
    first = fleet.targets[0]
    group = [fleet.add(first) for _ in range(3)]
    await until(lambda: all(s.ready() for s in group), 90, 0.2, f"{first}'s 3 replicas ready")
    await until(
        lambda: all(fleet.leaders().get((first, s)) == 1 for s in SCHEDULERS),
        60,
        0.2,
        f"{first}'s keys led",
    )
    await asyncio.sleep(fleet.ctx.profile.timings.schedlock_reserve_check_s)
    await _stable_sessions(fleet, 30)
    counts = []
    for _ in range(5):
        counts.append(per_target_counts(fleet.sidecar_sessions(), [first])[0][first])
        await asyncio.sleep(0.3)
    # Back to the fleet's replica count: the last one stops as a pod scaled down would.
    extra = group[-1]
    extra.signal(signal.SIGTERM)
    extra.wait(20)
    fleet.sidecars[first].remove(extra)
    return {"target": first, "replicas": 3, "sessions": statistics.median(counts)}


async def _start_fleet(fleet: Fleet) -> float:
    """Every target's replicas, staggered; seconds until all are ready."""
    p = fleet.ctx.profile
    t0 = time.monotonic()
    for target in fleet.targets:
        while len(fleet.sidecars[target]) < p.scale_targets_replicas:
            fleet.add(target)
            await asyncio.sleep(p.scale_targets_stagger_s)
    with contextlib.suppress(TimeoutError):
        await until(lambda: all(s.ready() for s in fleet.alive()), 180, 0.5, "sidecars ready")
    return time.monotonic() - t0


async def _sample(fleet: Fleet) -> dict[str, Any]:
    totals: list[int] = []
    per_target: dict[str, list[int]] = {t: [] for t in fleet.targets}
    unattributed: list[int] = []
    clients: list[int] = []
    for _ in range(SAMPLES):
        names = fleet.sidecar_sessions()
        counts, other = per_target_counts(names, fleet.targets)
        totals.append(len(names))
        unattributed.append(other)
        clients.append(fleet.client_sessions())
        for target, n in counts.items():
            per_target[target].append(n)
        await asyncio.sleep(0.5)
    medians = [statistics.median(v) for v in per_target.values()]
    max_connections = int(fleet.sql("SHOW max_connections")[0][0])
    reserved = fleet.reserved_slots()
    led = fleet.leaders()
    return {
        "total": {"median": statistics.median(totals), "max": max(totals)},
        "per_target": {
            "min": min(medians),
            "median": statistics.median(medians),
            "max": max(medians),
        },
        "unattributed": statistics.median(unattributed),
        "client_sessions_all": statistics.median(clients),
        "reserved_slots": reserved,
        "free_slots": free_slots(max_connections, reserved, int(statistics.median(clients))),
        "keys": 2 * len(fleet.targets),
        "keys_led": sum(1 for n in led.values() if n >= 1),
        "keys_led_twice": sum(1 for n in led.values() if n > 1),
        "targets_with_standby": fleet.targets_with_standby(),
    }


async def _window(fleet: Fleet) -> dict[str, Any]:
    """New connections/s, statements/s and refused connections over one quiet window."""
    refused_before = fleet.refused()
    before, t_before = fleet.counters(), time.monotonic()
    await asyncio.sleep(fleet.ctx.profile.scale_targets_window_s)
    after, window = fleet.counters(), time.monotonic() - t_before
    refused_after = fleet.refused()
    return {
        "new_connections_per_s": round((after[0] - before[0]) / window, 3),
        "statements_per_s": round((after[1] - before[1]) / window, 1),
        "refused_in_window": refused_after - refused_before,
        "refused_total": refused_after,
        "window_s": round(window, 1),
        "app_can_connect": fleet.app_can_connect(),
    }


def _first_after(fleet: Fleet, prefix: str, t_kill: float, victims: set[str]) -> float | None:
    assert fleet.log is not None
    found = [
        e.arrival
        for e in fleet.log.refresh()
        if e.uid.startswith(prefix) and e.arrival > t_kill and e.holder not in victims
    ]
    return min(found) if found else None


def _last_before(fleet: Fleet, prefix: str, t_kill: float, victims: set[str]) -> float:
    assert fleet.log is not None
    before = [
        e.arrival
        for e in fleet.log.entries
        if e.uid.startswith(prefix) and (e.arrival <= t_kill or e.holder in victims)
    ]
    return max(before) if before else t_kill


async def _gap(fleet: Fleet, prefix: str, t_kill: float, victims: set[str]) -> tuple[float, bool]:
    """From the last delivery of ``prefix`` before the kill to the first by a sidecar not
    among ``victims``, ms; capped (a lower bound) after ``SUCCESSOR_CAP_S``."""
    first: float | None = None
    with contextlib.suppress(TimeoutError):
        first = await until(
            lambda: _first_after(fleet, prefix, t_kill, victims),
            SUCCESSOR_CAP_S,
            0.01,
            f"a successor's delivery of {prefix}",
        )
    gap = ((first or time.time()) - _last_before(fleet, prefix, t_kill, victims)) * 1000
    return gap, first is None


async def _rows_flowing(fleet: Fleet, target: str, prefix: str) -> bool:
    """Rows of ``target`` due every 10 ms from half a second on, until some have arrived
    (False if none came within 30 s: the target lost its leader meanwhile)."""
    insert_due(
        fleet.url, prefix=prefix, count=300, start_at=time.time() + 0.5, spacing=0.01, target=target
    )
    assert fleet.log is not None
    log = fleet.log
    try:
        await until(
            lambda: any(e.uid.startswith(prefix) for e in log.refresh()[-50:]),
            30,
            0.02,
            f"{target}'s deliveries before the kill",
        )
    except TimeoutError:
        fleet.ctx.say(f"scale_targets: {target} delivered nothing in 30 s: trial skipped")
        return False
    await asyncio.sleep(0.3)
    return True


# A trial's outcome: (gap ms, capped?, had a session waiting on the victim's lock?).
Trial = tuple[float, bool, bool]


async def _kill_leader(fleet: Fleet, target: str, trial: int) -> Trial | None:
    """SIGKILL the publish leader of ``target``: (gap ms, capped?, had a standby waiting?),
    or None (skipped) when the target has no leader delivering."""
    leader = fleet.publish_leader(target)
    prefix = f"one{trial}-{target}"
    if leader is None or not await _rows_flowing(fleet, target, prefix):
        return None
    had_standby = fleet.waiters_on(leader.name) > 0
    t_kill = time.time()
    leader.signal(signal.SIGKILL)
    leader.wait(10)
    fleet.sidecars[target].remove(leader)
    gap, capped = await _gap(fleet, prefix, t_kill, {leader.name})
    replacement = fleet.add(target)
    with contextlib.suppress(TimeoutError):
        await until(replacement.ready, 60, 0.1, f"{replacement.name} ready")
    return gap, capped, had_standby


async def _kill_both(fleet: Fleet, target: str, trial: int) -> Trial | None:
    """SIGKILL every replica of ``target`` (its leader and its standby), start as many fresh
    ones at once: (gap ms until a replacement's first delivery, capped?), or None (skipped)
    when the target has no leader delivering."""
    prefix = f"both{trial}-{target}"
    leader = fleet.publish_leader(target)
    if leader is None or not await _rows_flowing(fleet, target, prefix):
        return None
    had_standby = fleet.waiters_on(leader.name) > 0
    victims_ = [s for s in fleet.sidecars[target] if s.alive()]
    victims = {s.name for s in victims_}
    t_kill = time.time()
    for victim in victims_:
        victim.signal(signal.SIGKILL)
    for _ in victims_:
        fleet.add(target)
    for victim in victims_:
        victim.wait(10)
        fleet.sidecars[target].remove(victim)
    return (*await _gap(fleet, prefix, t_kill, victims), had_standby)


async def _trials(
    fleet: Fleet,
    targets: list[str],
    kill: Callable[[Fleet, str, int], Awaitable[Trial | None]],
) -> dict[str, Any]:
    """One trial of ``kill`` per target: the gaps' summary, how many victims had a standby
    waiting, how many trials were skipped (no leader delivering)."""
    done = [t for i, target in enumerate(targets) if (t := await kill(fleet, target, i))]
    return {
        **summarize([gap for gap, _, _ in done], censored=sum(c for _, c, _ in done)),
        "with_standby": sum(s for _, _, s in done),
        "skipped": len(targets) - len(done),
    }


async def _measure(fleet: Fleet) -> dict[str, Any]:
    ctx, p = fleet.ctx, fleet.ctx.profile
    calibration = await _calibrate(fleet)
    ctx.say(f"scale_targets: 1 target x 3 replicas holds {calibration['sessions']:g} sessions")
    ready_s = await _start_fleet(fleet)
    not_ready = sum(not s.ready() for s in fleet.alive())
    ctx.say(f"scale_targets: {len(fleet.alive())} sidecars started in {ready_s:.0f} s")
    await asyncio.sleep(p.timings.schedlock_reserve_check_s)
    await _stable_sessions(fleet, 60)
    sessions = await _sample(fleet)
    ctx.say(f"scale_targets: sessions {sessions}")
    window = await _window(fleet)
    ctx.say(f"scale_targets: window {window}")
    # Trials on targets whose keys are led (a target none of whose sidecars got a session
    # has nothing to kill: counted in keys_led), alternate ones for each kind of trial.
    led = fleet.leaders()
    ready = [t for t in fleet.targets if all(led.get((t, k)) for k in SCHEDULERS)]
    evens, odds = ready[0::2], ready[1::2] or ready
    one = await _trials(fleet, spread(evens, p.scale_targets_kill_trials), _kill_leader)
    ctx.say(f"scale_targets: SIGKILL of a leader: {one}")
    both = await _trials(fleet, spread(odds, p.scale_targets_kill_both_trials), _kill_both)
    ctx.say(f"scale_targets: SIGKILL of both replicas: {both}")
    per_target_3 = float(calibration["sessions"])
    return {
        "targets": len(fleet.targets),
        "replicas": p.scale_targets_replicas,
        "max_connections": int(fleet.sql("SHOW max_connections")[0][0]),
        "app_pool": len(fleet.app_pool),
        "sessions": sessions,
        **window,
        "failover_sigkill_ms": one,
        "failover_both_killed_ms": both,
        "targets_led_for_trials": len(ready),
        "ready_s": round(ready_s, 1),
        "not_ready": not_ready,
        "rss_mb": summarize([rss_mb(s.pid) or 0.0 for s in fleet.alive()]),
        "sizing": {
            "per_target_at_3_replicas": per_target_3,
            "operator_sessions": OPERATOR_SESSIONS,
            "sessions_needed": {
                f"{targets}x{replicas}": sessions_needed(targets, per_target_3)
                for targets, replicas in SIZES
            },
        },
    }


async def run(ctx: Context) -> None:
    fleet = Fleet(ctx)
    try:
        fleet.start()
        result = await _measure(fleet)
    finally:
        fleet.stop()
    s = result["sessions"]
    ctx.say(
        f"scale_targets: {s['total']['median']:g} sidecar sessions "
        f"({s['per_target']['median']:g} per target), {s['free_slots']} slots free, "
        f"{result['new_connections_per_s']} new connections/s, refused "
        f"{result['refused_total']}, SIGKILL p99 {result['failover_sigkill_ms']['p99']} ms, "
        f"both killed p99 {result['failover_both_killed_ms']['p99']} ms"
    )
    ctx.results["scale_targets"] = result
