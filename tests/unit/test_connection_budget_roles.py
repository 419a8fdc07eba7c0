"""The connection budget, in-process: leader / standby / reserve against the in-memory store
and virtual time — the turns of the reserves (pure), each role change, and refused connections.

The in-memory store (``testbed.memory_store``) keeps what PostgreSQL keeps for us: the key's
lock with its queue of waiters (granted in order when the holder's session ends), the standby
places (try-locks), the reserve roster and the sessions open.  Replicas are electors sharing
it; killing one cancels its task, which closes its session as the server would on a SIGKILL.
They run on virtual time (``testbed.virtual_time``): a wait of the elector or a test's
``asyncio.sleep`` takes no real time, so bounds are asserted exactly.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import pytest

from schedlock.core.aio import now
from schedlock.core.timings import LeaseTimings
from schedlock.sidecar.lock import Elector, Leadership, Role
from schedlock.sidecar.metrics import SidecarMetrics
from schedlock.sidecar.reserve import (
    JITTER,
    REFUSED_CAP,
    grace,
    next_check_in,
    refused_backoff,
)
from schedlock.store import LeadershipLost
from testbed.memory_store import KEY, MemoryApp, MemorySession, MemoryStore
from testbed.sidecars import sample_value
from testbed.virtual_time import quiet, run

INTERVAL = 5.0
BOUND = INTERVAL * (1 + JITTER)

# -- the turns (pure) ------------------------------------------------------------------------


def test_a_turn_is_strictly_ahead_and_within_one_rotation() -> None:
    for at in (1000.0, 1002.5, 1004.999, 1005.0):
        for reserves in (1, 3, 50):
            for rank in range(reserves):
                wait = next_check_in(at, rank=rank, reserves=reserves, interval=5, draw=0)
                assert 0 < wait <= reserves * 5
                assert ((at + wait) / 5) % reserves == pytest.approx(rank, abs=1e-6)


def test_the_reserves_together_check_once_per_interval_whatever_their_number() -> None:
    for reserves in (1, 7, 100):
        turns = sorted(
            1000.0 + next_check_in(1000.0, rank=r, reserves=reserves, interval=5, draw=0)
            for r in range(reserves)
        )
        gaps = [b - a for a, b in zip([1000.0, *turns], turns, strict=False)]
        assert max(gaps) <= 5.0 + 1e-9, "from any instant, some reserve's turn is ≤ one interval"
        assert len(turns) == reserves


def test_jitter_only_delays_by_a_tenth_at_most() -> None:
    base = next_check_in(1001.0, rank=0, reserves=1, interval=5, draw=0)
    most = next_check_in(1001.0, rank=0, reserves=1, interval=5, draw=0.999)
    assert base == pytest.approx(4.0) and base < most < base + JITTER * 5


def test_refusal_backoff_doubles_to_a_cap_with_jitter() -> None:
    backoff = refused_backoff(random.Random(3))
    seen: list[float] = []
    spread: list[float] = []
    for _ in range(10):
        seen.append(backoff.base)
        spread.append(backoff.next() / seen[-1])
    assert seen[:4] == [1.0, 2.0, 4.0, 8.0] and seen[-1] == REFUSED_CAP
    assert all(0.5 <= s < 1.5 for s in spread) and len(set(spread)) > 1
    backoff.reset()
    assert backoff.base == 1.0
    assert grace(0.5) == 5.0 and grace(30) == 30


# -- replicas on virtual time (the database is testbed.memory_store's) ----------------------


@dataclass
class Replica:
    elector: Elector
    task: asyncio.Task[None]
    led_at: list[float]

    @property
    def role(self) -> Role:
        return self.elector.role

    def gauge(self, role: str) -> float | None:
        return sample_value(
            self.elector.metrics.registry,
            "schedlock_role",
            {"scheduler": "publish", "namespace": "default", "target": "demo", "role": role},
        )


class Fleet:
    """Replicas of one app, sharing the in-memory store and the loop's virtual time."""

    def __init__(self, standbys: int = 2) -> None:
        self.db = MemoryStore()
        self.standbys = standbys
        self.replicas: list[Replica] = []
        self.stopping = asyncio.Event()

    def start(self, name: str) -> Replica:
        led_at: list[float] = []

        async def work(leadership: Leadership, ending: asyncio.Event) -> None:
            led_at.append(now())
            session = leadership.session
            assert isinstance(session, MemorySession)
            ended = session.root.ended
            dead = asyncio.ensure_future(ended.wait())
            end = asyncio.ensure_future(ending.wait())
            try:
                await asyncio.wait([dead, end], return_when=asyncio.FIRST_COMPLETED)
            finally:
                dead.cancel()
                end.cancel()
            if ended.is_set():
                raise LeadershipLost("session ended")

        elector = Elector(
            self.db,
            (KEY,),
            holder=name,
            timings=LeaseTimings(10, 3),
            metrics=SidecarMetrics(),
            work=work,
            app=MemoryApp(),
            standbys=self.standbys,
            reserve_check_seconds=INTERVAL,
            rng=random.Random(len(self.replicas)),
        )
        replica = Replica(elector, asyncio.create_task(elector.run(self.stopping)), led_at)
        self.replicas.append(replica)
        return replica

    async def kill(self, *replicas: Replica) -> None:
        """SIGKILL: the process is gone, the server ends its session (and so its locks)."""
        for replica in replicas:
            replica.task.cancel()
        await asyncio.gather(*(r.task for r in replicas), return_exceptions=True)
        for replica in replicas:
            self.replicas.remove(replica)
        await quiet()

    def with_role(self, role: Role) -> list[Replica]:
        return [r for r in self.replicas if r.role is role]

    def census(self) -> tuple[int, int, int]:
        return (
            len(self.with_role(Role.LEADING)),
            len(self.with_role(Role.STANDBY)),
            len(self.with_role(Role.RESERVE)),
        )

    async def stop(self) -> None:
        self.stopping.set()
        await asyncio.gather(*(r.task for r in self.replicas), return_exceptions=True)


def on_virtual_time(test: Callable[[Fleet], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    """The test, run on a virtual-time loop (``testbed.virtual_time``) with a fleet of its own."""

    def run_test() -> None:
        async def main() -> None:
            fleet = Fleet()
            try:
                await test(fleet)
            finally:
                await fleet.stop()

        run(main())

    run_test.__name__, run_test.__doc__ = test.__name__, test.__doc__
    return run_test


async def start_many(fleet: Fleet, count: int, *, settled: bool = True) -> list[Replica]:
    """Start ``count`` replicas; ``settled``: let the first turns pass (the reserves enlisted,
    each with its turn)."""
    replicas = [fleet.start(f"app-{i:02d}") for i in range(count)]
    await quiet()
    if settled:
        await asyncio.sleep(2 * BOUND)
    return replicas


# -- the roles ----------------------------------------------------------------------------------


@on_virtual_time
async def test_sessions_are_bounded_by_one_plus_standbys(fleet: Fleet) -> None:
    await start_many(fleet, 10, settled=False)
    # The first replica found the lock free and took it with no standby place: both places
    # filled at once, not one of them only at a reserve's turn.
    assert fleet.census() == (1, 2, 7), "the standby places are filled from the start"
    await asyncio.sleep(BOUND)
    assert fleet.census() == (1, 2, 7), "and stay so"
    assert len(fleet.db.sessions) == 3, "leader + 2 standbys; reserves hold none"
    assert sorted(fleet.db.places) == [0, 1]
    assert fleet.db.live_roster() == sorted(r.elector.holder for r in fleet.with_role(Role.RESERVE))
    reserve = fleet.with_role(Role.RESERVE)[0]
    assert (reserve.gauge("reserve"), reserve.gauge("standby"), reserve.gauge("leader")) == (
        1,
        0,
        0,
    )
    leader = fleet.with_role(Role.LEADING)[0]
    assert leader.gauge("leader") == 1
    sessions = sample_value(leader.elector.metrics.registry, "schedlock_database_sessions")
    assert sessions == 1


@on_virtual_time
async def test_a_reserve_whose_app_goes_away_stops_waiting_for_its_turn_at_once(
    fleet: Fleet,
) -> None:
    await start_many(fleet, 5)
    reserve = fleet.with_role(Role.RESERVE)[0]
    app = reserve.elector.app
    assert isinstance(app, MemoryApp)
    app.set(False)
    await quiet()
    assert reserve.role is Role.WAITING_FOR_APP, "not a turn later"
    app.set(True)
    await quiet()
    assert reserve.role is not Role.WAITING_FOR_APP


@on_virtual_time
async def test_reserves_together_check_about_once_per_interval(fleet: Fleet) -> None:
    await start_many(fleet, 20, settled=False)
    first = fleet.db.connects
    assert first == 20, "everyone checks once at start"
    await asyncio.sleep(20 * INTERVAL)  # a settled roster after the first rotation
    before = fleet.db.connects
    await asyncio.sleep(100.0)
    checks = fleet.db.connects - before
    assert 100 / BOUND - 2 <= checks <= 100 / INTERVAL + 2, checks
    assert fleet.census() == (1, 2, 17)


@on_virtual_time
async def test_standby_takes_over_at_once_and_a_reserve_fills_its_place(fleet: Fleet) -> None:
    await start_many(fleet, 5)
    leader = fleet.with_role(Role.LEADING)[0]
    first_standby = fleet.db.queue[0][0].holder
    killed_at = now()
    await fleet.kill(leader)
    new_leader = fleet.with_role(Role.LEADING)[0]
    assert new_leader.elector.holder == first_standby
    assert new_leader.led_at == [killed_at], "granted the moment the session ended"
    assert fleet.census() == (1, 1, 2), "the new leader gave its standby place back"
    assert len(fleet.db.places) == 1
    await asyncio.sleep(BOUND)
    assert fleet.census() == (1, 2, 1), "reserve -> standby within one interval"
    assert all(
        r.elector.holder not in fleet.db.live_roster() for r in fleet.with_role(Role.STANDBY)
    )


@on_virtual_time
async def test_a_lost_standby_is_replaced_within_the_interval(fleet: Fleet) -> None:
    await start_many(fleet, 5)
    standby = fleet.with_role(Role.STANDBY)[0]
    await fleet.kill(standby)
    assert fleet.census() == (1, 1, 2)
    await asyncio.sleep(BOUND)
    assert fleet.census() == (1, 2, 1)
    assert len(fleet.db.sessions) == 3


@on_virtual_time
async def test_a_standby_whose_session_dies_reconnects_and_competes_again(fleet: Fleet) -> None:
    await start_many(fleet, 4)
    standby = fleet.with_role(Role.STANDBY)[0]
    session = next(s for s, _ in fleet.db.queue if s.holder == standby.elector.holder)
    fleet.db.end(session)  # pg_terminate_backend: the session dies under its holder
    await asyncio.sleep(1.0)  # its reconnect back-off (0.1 to 0.3 s)
    leaders, standbys, reserves = fleet.census()
    assert (leaders, standbys + reserves) == (1, 3) and standbys <= 2
    assert len(fleet.db.sessions) <= 3


@on_virtual_time
async def test_leader_and_every_standby_lost_at_once(fleet: Fleet) -> None:
    await start_many(fleet, 12)
    await asyncio.sleep(12 * INTERVAL)  # settled turns
    gone = fleet.with_role(Role.LEADING) + fleet.with_role(Role.STANDBY)
    assert len(gone) == 3
    killed_at = now()
    await fleet.kill(*gone)
    assert fleet.census() == (0, 0, 9), "nobody holds a session: the reserves' turns decide"
    await asyncio.sleep(BOUND)
    leaders = fleet.with_role(Role.LEADING)
    assert len(leaders) == 1
    took = leaders[0].led_at[0] - killed_at
    assert 0 < took <= BOUND, took
    await asyncio.sleep(2 * BOUND)
    assert fleet.census() == (1, 2, 6), "and the standby places fill again, one per turn"


@on_virtual_time
async def test_refused_connections_back_off_with_jitter_and_say_so(fleet: Fleet) -> None:
    await start_many(fleet, 4)
    await asyncio.sleep(4 * INTERVAL)
    reserve = fleet.with_role(Role.RESERVE)[0]
    fleet.db.refuse = True
    await fleet.kill(*fleet.with_role(Role.STANDBY))
    attempts: list[float] = []
    before = fleet.db.refusals
    for _ in range(40):
        await asyncio.sleep(1.0)
        if fleet.db.refusals > before:
            attempts.append(now())
            before = fleet.db.refusals
    assert reserve.role is Role.RESERVE and reserve.elector.refused
    assert "too many clients" in (reserve.elector.refused or "")
    refused = sample_value(
        reserve.elector.metrics.registry, "schedlock_database_connections_refused_total"
    )
    assert refused is not None and refused >= 2
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    assert gaps and all(g >= INTERVAL for g in gaps), "never sooner than its turn"
    assert sorted(gaps) == gaps or len(set(gaps)) > 1, "growing or spread, never a fixed storm"
    assert fleet.census()[0] == 1, "the leader keeps its session all along"
    fleet.db.refuse = False
    await asyncio.sleep(REFUSED_CAP * 1.5 + 10 * INTERVAL)
    assert fleet.census() == (1, 1, 0), "the one reserve left took a standby place"
    assert all(r.elector.refused is None for r in fleet.replicas)
