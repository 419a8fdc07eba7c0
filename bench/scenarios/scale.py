"""Scale: the connection budget — N replicas of one target at PostgreSQL's default
``max_connections`` (100), the bounded design against the one-session-per-replica baseline.

For each design and each replica count (``Profile.scale_replicas``: 5, 20, 50) one target's
sidecars (both schedulers: 2 lock keys) start on a fresh database, then:

* sessions held: client sessions on the database (``pg_stat_activity``), sampled ``SAMPLES``
  times once every key is led and the standby places are filled;
* new connections/s and statements/s over a quiet window, from ``pg_stat_database``
  (``sessions`` and ``xact_commit``: every statement of an autocommit session is one
  transaction; our own sampling runs on another database, and no leader check runs in the
  window, so neither is counted) — right
  after the start, and in full runs again once the reserves' turns have settled (one
  rotation: every reserve has checked with the whole roster in view);
* refused connections (``schedlock_database_connections_refused_total`` summed over the
  sidecars) and whether each key had exactly one leader;
* SIGKILL failover: rows due every 10 ms, the publish leader SIGKILLed, the gap at the
  receiver between the last delivery before the kill and the first one by a successor;
  a fresh replica then replaces the dead one and the places refill before the next trial.

``bounded`` is schedlock as shipped (``SCHEDLOCK_STANDBYS`` at its default, 1: the leader and
one standby hold a session each, for both keys; reserves hold none); ``baseline`` sets
``SCHEDLOCK_STANDBYS`` beyond any replica count, so every replica waits on a session of its
own — one per replica, where the design before the connection budget held one per replica
per key and a separate LISTEN session per led key.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import statistics
import time
from typing import Any

from bench.context import Context
from bench.rows import insert_due
from bench.stats import summarize
from bench.systems import rss_mb, until
from schedlock.core.identities import Scheduler
from schedlock.sidecar.settings import SidecarSettings
from schedlock.store import LockKey
from testbed.deliveries import DeliveryLog
from testbed.leaders import leader, leaders
from testbed.sidecars import ReceiverProcess, SidecarProcess

SAMPLES = 10
TRIAL_ROWS = 300  # rows each trial inserts, due every 10 ms around its SIGKILL
TARGET = "app"
NAMESPACE = "default"  # the sidecars' default
DESIGNS = {"bounded": {}, "baseline": {"SCHEDLOCK_STANDBYS": "10000"}}
# the shipped default, which the bounded design runs with
STANDBYS: int = SidecarSettings.standbys
PLACES = 1 + STANDBYS  # sessions a target holds in the bounded design: its leader's, standbys'
REFUSED = "schedlock_database_connections_refused_total"


def _sessions(ctx: Context, dbname: str) -> int:
    return int(
        ctx.env.sql(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s "
            "AND backend_type = 'client backend'",
            (dbname,),
        )[0][0]
    )


def _counters(ctx: Context, dbname: str) -> tuple[int, int]:
    """(sessions established, transactions committed) of the database so far."""
    row = ctx.env.sql(
        "SELECT sessions, xact_commit FROM pg_stat_database WHERE datname = %s", (dbname,)
    )[0]
    return int(row[0]), int(row[1])


def _leader(fleet: Fleet) -> SidecarProcess | None:
    name = leader(fleet.url, LockKey(Scheduler.PUBLISH, NAMESPACE, TARGET))
    return next((s for s in fleet.sidecars if s.alive() and s.name == name), None)


class Fleet:
    """One design at one replica count: its sidecars, receiver and database."""

    def __init__(self, ctx: Context, design: str, replicas: int) -> None:
        self.ctx = ctx
        self.design = design
        self.dbname = ctx.env.new_database(f"scale_{design}_{replicas}")
        self.url = ctx.env.url(self.dbname)
        self.workdir = ctx.env.workdir / self.dbname
        self.receiver = ReceiverProcess(self.workdir / "receiver").start()
        self.log = DeliveryLog(self.receiver.log_path)
        self.sidecars: list[SidecarProcess] = []
        self.started = 0
        self.last_start = time.monotonic()  # when the latest sidecar was started

    def add(self) -> SidecarProcess:
        env = {
            "SCHEDLOCK_DATABASE_URL": self.url,
            "SCHEDLOCK_TARGET": TARGET,
            "SCHEDLOCK_TARGET_URL": self.receiver.url,
            "SCHEDLOCK_LOG_FORMAT": "json",
            **self.ctx.profile.timings.schedlock_env(),
            **DESIGNS[self.design],
        }
        sidecar = SidecarProcess(f"{TARGET}-{self.started}", self.workdir / "sidecars", env)
        self.started += 1
        self.sidecars.append(sidecar.start())
        self.last_start = time.monotonic()
        return sidecar

    def one_leader_per_key(self) -> bool:
        led = leaders(self.url)
        return all(LockKey(s, NAMESPACE, TARGET) in led for s in Scheduler)

    def refused(self) -> int:
        return int(sum(s.metrics().get(REFUSED, 0) for s in self.sidecars if s.alive()))

    def stop(self) -> None:
        for sidecar in self.sidecars:
            sidecar.signal(signal.SIGTERM)
        for sidecar in self.sidecars:
            sidecar.stop()
        self.receiver.stop()


async def _settle(fleet: Fleet, replicas: int) -> None:
    """Wait for the places the leaders gave back to fill (the reserves' next turns): the
    bounded design then holds one session per sidecar for the leader and each standby
    (1 + ``SCHEDLOCK_STANDBYS``); the baseline holds its own at once."""
    interval = fleet.ctx.profile.timings.schedlock_reserve_check_s
    if fleet.design == "baseline":
        await asyncio.sleep(1.0)
        return
    expected = min(replicas, PLACES)
    try:
        await until(
            lambda: _sessions(fleet.ctx, fleet.dbname) >= expected, 3 * interval + 5, 0.1, "places"
        )
    except TimeoutError:
        fleet.ctx.say(f"scale {fleet.design} x{replicas}: standby places not refilled in time")


async def _failover(fleet: Fleet, trial: int) -> float:
    """SIGKILL the publish leader while rows are due every 10 ms; the gap at the receiver, ms."""
    leader = await until(lambda: _leader(fleet), 60, 0.05, "a publish leader")
    prefix = f"kill{trial}"
    start = time.time() + 0.5
    insert_due(
        fleet.url, prefix=prefix, count=TRIAL_ROWS, start_at=start, spacing=0.01, target=TARGET
    )
    await until(
        lambda: any(e.uid.startswith(prefix) for e in fleet.log.refresh()[-50:]),
        30,
        0.02,
        "deliveries before the kill",
    )
    await asyncio.sleep(0.3)
    t_kill = time.time()
    leader.signal(signal.SIGKILL)
    leader.wait(10)
    fleet.sidecars.remove(leader)

    def successor_arrival() -> float | None:
        found = [
            e.arrival
            for e in fleet.log.refresh()
            if e.uid.startswith(prefix) and e.arrival > t_kill and e.holder != leader.name
        ]
        return min(found) if found else None

    first = await until(successor_arrival, 60, 0.01, "a successor's delivery")
    before = [
        e.arrival
        for e in fleet.log.entries
        if e.uid.startswith(prefix) and (e.arrival <= t_kill or e.holder == leader.name)
    ]
    last = max(before) if before else t_kill
    # The rest of the trial's rows fire before anything else is measured: the next trial, or
    # the settled window's statements/s (which they would count as the leader's idle work).
    with contextlib.suppress(TimeoutError):
        await until(
            lambda: (
                len({e.uid for e in fleet.log.refresh() if e.uid.startswith(prefix)}) >= TRIAL_ROWS
            ),
            30,
            0.05,
            "the trial's rows",
        )
    # Back to N replicas: it starts as a reserve (or a standby, a place being free); its
    # start-up connections (schema check, first checks) stay out of the windows measured next.
    replacement = fleet.add()
    with contextlib.suppress(TimeoutError):
        await until(replacement.ready, 60, 0.1, f"{replacement.name} to be ready")
    return (first - last) * 1000


async def _rates(fleet: Fleet) -> dict[str, float]:
    """New connections/s and statements/s on the database over one quiet window."""
    before, t_before = _counters(fleet.ctx, fleet.dbname), time.monotonic()
    await asyncio.sleep(fleet.ctx.profile.scale_window_s)
    after, window = _counters(fleet.ctx, fleet.dbname), time.monotonic() - t_before
    return {
        "new_connections_per_s": round((after[0] - before[0]) / window, 3),
        "statements_per_s": round((after[1] - before[1]) / window, 1),
        "window_s": round(window, 1),
    }


async def _measure(ctx: Context, design: str, replicas: int) -> dict[str, Any]:
    p = ctx.profile
    interval = p.timings.schedlock_reserve_check_s
    fleet = Fleet(ctx, design, replicas)
    try:
        t0 = time.monotonic()
        for _ in range(replicas):
            fleet.add()
        # The baseline may not fit (a session per replica per key, against 100 slots): its
        # last sidecars cannot even read the schema. Wait a bounded time and count them.
        with contextlib.suppress(TimeoutError):
            await until(lambda: all(s.ready() for s in fleet.sidecars), 120, 0.2, "sidecars ready")
        ready_s = time.monotonic() - t0
        not_ready = sum(not s.ready() for s in fleet.sidecars)
        await until(fleet.one_leader_per_key, 60, 0.1, "one leader per key")
        await _settle(fleet, replicas)
        sessions = []
        one_leader = True
        for _ in range(SAMPLES):
            sessions.append(_sessions(ctx, fleet.dbname))
            one_leader = one_leader and fleet.one_leader_per_key()
            await asyncio.sleep(0.2)
        at_start = await _rates(fleet)
        gaps: list[float] = []
        for trial in range(p.scale_failover_trials):
            gaps.append(await _failover(fleet, trial))
            await _settle(fleet, replicas)
        settled = None
        if p.scale_settled and fleet.design == "bounded":
            # Replicas that start together enlist with differing views of the roster (the
            # first ones see few reserves, so they check again soon): the turns settle after
            # one rotation, every reserve having checked once with the full roster in view —
            # counted from the start of the latest replacement, which enlisted the same way.
            rotation = max(0, replicas - PLACES) * interval  # the reserves, in turn
            since = max(t0 + ready_s, fleet.last_start)
            await asyncio.sleep(max(0.0, since + rotation - time.monotonic()))
            settled = await _rates(fleet)
        result: dict[str, Any] = {
            "replicas": replicas,
            "keys": 2,
            "sessions_held": {"median": statistics.median(sessions), "max": max(sessions)},
            # The first window right after the start, and (full runs) one after a rotation.
            "new_connections_per_s": (settled or at_start)["new_connections_per_s"],
            "statements_per_s": (settled or at_start)["statements_per_s"],
            "at_start": at_start,
            "settled": settled,
            "one_leader_per_key": one_leader,
            "refused_connections": fleet.refused(),
            "failover_sigkill_ms": summarize(gaps),
            "ready_s": round(ready_s, 1),
            "not_ready": not_ready,
            "rss_mb": summarize([rss_mb(s.pid) or 0.0 for s in fleet.sidecars if s.alive()]),
        }
        ctx.say(
            f"scale {design} x{replicas}: {result['sessions_held']['median']:g} sessions, "
            f"{result['new_connections_per_s']} new connections/s, "
            f"{result['statements_per_s']} statements/s, SIGKILL gap p99 "
            f"{result['failover_sigkill_ms']['p99']} ms, refused {result['refused_connections']}"
        )
        return result
    finally:
        fleet.stop()


async def run(ctx: Context) -> None:
    p = ctx.profile
    max_conn = int(ctx.env.sql("SHOW max_connections")[0][0])
    designs: dict[str, list[dict[str, Any]]] = {}
    for design in DESIGNS:
        designs[design] = [await _measure(ctx, design, n) for n in p.scale_replicas]
    largest = designs["bounded"][-1]
    ctx.results["scale"] = {
        "max_connections": max_conn,
        "target_replicas": list(p.scale_replicas),
        "reserve_check_s": p.timings.schedlock_reserve_check_s,
        "standbys": STANDBYS,
        "designs": designs,
        # Headline figures of the bounded design at the largest replica count.
        "sidecars": largest["replicas"],
        "one_leader_per_key": all(r["one_leader_per_key"] for r in designs["bounded"]),
        "connections": int(largest["sessions_held"]["max"]),
    }
