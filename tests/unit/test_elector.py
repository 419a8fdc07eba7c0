"""The elector's state machine (``schedlock.sidecar.lock``) against the in-memory store, on
virtual time (``testbed.virtual_time``): step-down, lease loss, heartbeat failure, release
and hand-over, each in milliseconds of real time and exact to the virtual second.

The SIGSTOP runs of ``tests/e2e/test_leadership.py`` prove the same against PostgreSQL; these
pin down the timings and the order of the steps, which a process run can only bound.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import pytest

from schedlock.core.aio import now
from schedlock.core.timings import LeaseTimings
from schedlock.sidecar.lock import Elector, Leadership, Role
from schedlock.sidecar.metrics import SidecarMetrics
from schedlock.store import ForeignHolder, UnlockFailed
from testbed.memory_store import KEY, MemoryApp, MemorySession, MemoryStore
from testbed.sidecars import sample_value
from testbed.virtual_time import run

TIMINGS = LeaseTimings(10.0)
LEASE, HEARTBEAT, STEP_DOWN = 10.0, 3.0, 8.0  # what TIMINGS derives (checked below)
LABELS = {"scheduler": "publish", "namespace": "default", "target": "demo"}


@dataclass
class Replica:
    elector: Elector
    stopping: asyncio.Event
    task: asyncio.Task[None]
    terms: list[tuple[int, float]]  # (term, virtual time it started)
    ends: list[tuple[str, float]]  # ("ended" | "cancelled", virtual time)

    roles: list[tuple[Role, float]]  # each role taken, and the virtual time it was taken

    def metric(self, name: str, **labels: str) -> float | None:
        return sample_value(self.elector.metrics.registry, name, {**LABELS, **labels})

    def database_up(self) -> float | None:
        return sample_value(self.elector.metrics.registry, "schedlock_database_up")

    def left_leading(self, after: float) -> float:
        """When this replica first stopped leading after ``after`` (virtual time)."""
        times = [at for role, at in self.roles if role is not Role.LEADING and at > after]
        return times[0]

    async def stop(self) -> None:
        self.stopping.set()
        await asyncio.wait_for(self.task, 60)


def start(server: MemoryStore, name: str) -> Replica:
    terms: list[tuple[int, float]] = []
    ends: list[tuple[str, float]] = []

    async def work(leadership: Leadership, ending: asyncio.Event) -> None:
        terms.append((leadership.term, now()))
        try:
            await ending.wait()
        except asyncio.CancelledError:
            ends.append(("cancelled", now()))
            raise
        ends.append(("ended", now()))

    elector = Elector(
        server,
        (KEY,),
        holder=name,
        timings=TIMINGS,
        metrics=SidecarMetrics(),
        work=work,
        app=MemoryApp(),
        rng=random.Random(name),
    )
    roles: list[tuple[Role, float]] = []
    set_role = elector._set_role

    def record(role: Role) -> None:
        if not roles or roles[-1][0] is not role:
            roles.append((role, now()))
        set_role(role)

    elector._set_role = record  # type: ignore[method-assign]
    stopping = asyncio.Event()
    task = asyncio.create_task(elector.run(stopping), name=f"elector:{name}")
    return Replica(elector, stopping, task, terms, ends, roles)


async def until(predicate: Callable[[], bool], within: float = 60.0) -> float:
    """Wait (virtual time) until ``predicate`` holds; the virtual time it took."""
    started = now()
    async with asyncio.timeout(within):
        while not predicate():
            await asyncio.sleep(0.01)
    return now() - started


def holding(server: MemoryStore) -> MemorySession:
    """The session holding the lock now."""
    assert server.holder is not None
    return server.holder


def leading(replica: Replica) -> bool:
    return replica.elector.role is Role.LEADING


def scenario(body: Callable[[MemoryStore], Awaitable[None]]) -> None:
    async def main() -> None:
        await body(MemoryStore())

    run(main())


async def leader(server: MemoryStore) -> Replica:
    """Replica "a", started on its own, once it leads."""
    a = start(server, "a")
    await until(lambda: leading(a))
    return a


async def leader_and_standby(server: MemoryStore) -> tuple[Replica, Replica]:
    a = await leader(server)
    b = start(server, "b")
    await until(lambda: b.elector.role is Role.STANDBY and len(server.queue) == 1)
    return a, b


# -- the tests ----------------------------------------------------------------------------------


def test_the_timings_these_tests_assume() -> None:
    assert (TIMINGS.lease_seconds, TIMINGS.heartbeat_seconds) == (LEASE, HEARTBEAT)
    assert TIMINGS.step_down_after == STEP_DOWN


def test_a_frozen_network_steps_down_at_lease_minus_margin_not_before() -> None:
    async def body(server: MemoryStore) -> None:
        a = await leader(server)
        led_at = a.terms[0][1]
        await asyncio.sleep(HEARTBEAT + 0.5)
        assert leading(a), "a heartbeat went through: still leading"
        holding(server).beats = "hang"
        await until(lambda: not leading(a))
        stepped_down = a.left_leading(led_at) - led_at
        # The last good heartbeat was at 3 s; the next one hangs; the budget runs out at
        # 3 + 8 s — before the server-side lease (10 s after the last heartbeat) ends it.
        assert stepped_down == pytest.approx(HEARTBEAT + STEP_DOWN)
        assert stepped_down < HEARTBEAT + LEASE
        assert a.ends == [("cancelled", led_at + stepped_down)], "the term's work is cut"
        assert "a:release:1" not in server.steps, "no unlock on a session we cannot trust"
        assert a.metric("schedlock_leader") == 0
        lost = a.metric("schedlock_leadership_transitions_total", direction="lost")
        assert lost == 1
        assert "stepping down" in (a.elector.last_error or "")
        await a.stop()

    scenario(body)


def test_a_failed_heartbeat_steps_down_at_once_and_reconnects_after_a_backoff() -> None:
    async def body(server: MemoryStore) -> None:
        a = await leader(server)
        holding(server).beats = "fail"
        await until(lambda: not leading(a))
        led_at = a.terms[0][1]
        stepped_down = a.left_leading(led_at)
        assert stepped_down - led_at == pytest.approx(HEARTBEAT)
        assert a.database_up() == 0
        await until(lambda: len(a.terms) == 2)
        assert a.database_up() == 1
        # Back-off 0.2 s with jitter in [0.5, 1.5): a new session, a new term.
        assert 0.1 <= a.terms[1][1] - stepped_down < 0.3
        assert a.terms[1][0] == 2
        assert server.steps.count("a:connect") == 2
        await a.stop()

    scenario(body)


def test_a_lost_lease_hands_over_to_the_standby_at_once_and_fences_the_old_leader() -> None:
    async def body(server: MemoryStore) -> None:
        a, b = await leader_and_standby(server)
        await asyncio.sleep(1.0)
        assert server.holder is not None
        lost_at = now()
        server.end(holding(server))  # the server ends a's session (idle_session_timeout)
        await until(lambda: leading(b))
        assert b.terms == [(2, lost_at)], "granted in the same instant, a new term fences a's"
        # a finds out at its next heartbeat (its statements would fail meanwhile: fenced).
        await until(lambda: not leading(a))
        assert 0 < a.left_leading(lost_at) - lost_at <= HEARTBEAT
        assert leading(b)
        await until(lambda: a.elector.role is Role.STANDBY)
        await a.stop()
        await b.stop()

    scenario(body)


def test_sigterm_releases_with_a_checked_unlock_and_the_standby_leads_at_once() -> None:
    async def body(server: MemoryStore) -> None:
        a, b = await leader_and_standby(server)
        stopped_at = now()
        await a.stop()
        assert a.elector.role is Role.RELEASED
        assert a.ends == [("ended", stopped_at)], "a graceful end of the term's work"
        assert server.steps.index("a:release:1") < server.steps.index("a:close")
        await until(lambda: leading(b))
        assert b.terms == [(2, stopped_at)], "no lease to wait out"
        released = a.metric("schedlock_leadership_transitions_total", direction="released")
        assert released == 1
        assert b.metric("schedlock_handover_gap_seconds_count") == 1
        assert b.metric("schedlock_handover_gap_seconds_sum") == 0
        await b.stop()

    scenario(body)


def test_a_standby_stopped_leaves_the_queue_without_ever_leading() -> None:
    async def body(server: MemoryStore) -> None:
        a, b = await leader_and_standby(server)
        await b.stop()
        assert b.terms == [] and server.queue == []
        assert leading(a)
        await a.stop()

    scenario(body)


def test_every_failure_of_a_term_is_logged_with_its_task(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="schedlock.lock")

    async def body(server: MemoryStore) -> None:
        a = await leader(server)
        holding(server).beats = "fail"
        await until(lambda: not leading(a))
        await a.stop()

    scenario(body)
    failed = [r for r in caplog.records if getattr(r, "event", None) == "task_failed"]
    assert [getattr(r, "task", None) for r in failed] == [f"heartbeat:{KEY}"]
    assert "StoreUnavailable" in getattr(failed[0], "error", "")


def test_a_standby_says_a_foreign_holder_until_it_leads(caplog: pytest.LogCaptureFixture) -> None:
    """Lock squatting: what the wait hears of a foreign holder shows as the metric, the words
    for /readyz and one log event each way; the standby leads once the holder's session ends."""
    caplog.set_level(logging.INFO, logger="schedlock.lock")
    squatter = ForeignHolder(pid=4242, role="tenant_a\n'x")

    async def body(server: MemoryStore) -> None:
        squatting = server.occupied_by("squatter")
        b = start(server, "b")
        await until(lambda: b.elector.role is Role.STANDBY and len(server.queue) == 1)
        assert b.metric("schedlock_lock_foreign_holder") == 0 and b.elector.squatted is None
        server.squat(squatter)
        server.squat(squatter)  # the same holder again: nothing new is said
        assert [held for held, _since in b.elector.foreign.values()] == [squatter]
        assert b.metric("schedlock_lock_foreign_holder") == 1
        said = b.elector.squatted or ""
        assert said.startswith("default/demo: lock held by role 'tenant_a")
        assert "(backend pid 4242) since " in said and "\n" not in said
        server.end(squatting)  # an admin's pg_terminate_backend
        await until(lambda: leading(b))
        assert b.metric("schedlock_lock_foreign_holder") == 0 and b.elector.squatted is None
        await b.stop()

    scenario(body)
    events = [
        (r.event, getattr(r, "pid", None))  # type: ignore[attr-defined]
        for r in caplog.records
        if str(getattr(r, "event", "")).startswith("lock_")
        and getattr(r, "event", "") != "lock_session_lost"
    ]
    assert events == [("lock_held_by_foreign_role", 4242), ("lock_foreign_holder_gone", 4242)]


def test_a_standby_behind_its_own_leader_hears_of_no_foreign_holder() -> None:
    async def body(server: MemoryStore) -> None:
        a, b = await leader_and_standby(server)
        assert not b.elector.foreign
        assert b.metric("schedlock_lock_foreign_holder") == 0
        await a.stop()
        await until(lambda: leading(b))
        await b.stop()

    scenario(body)


def test_a_failed_unlock_is_fatal() -> None:
    async def body(server: MemoryStore) -> None:
        a = await leader(server)
        server.holder = None  # the lock is not ours any more, the session does not know
        a.stopping.set()
        with pytest.raises(UnlockFailed):
            await asyncio.wait_for(a.task, 60)

    scenario(body)


def test_a_lease_is_ok_until_lease_minus_margin_after_the_last_heartbeat() -> None:
    async def body(server: MemoryStore) -> None:
        leadership = Leadership(
            key=KEY,
            session=server.lock_session(KEY, "a", LEASE),
            term=1,
            step_down_after=STEP_DOWN,
            last_heartbeat_ok=now(),
        )
        await asyncio.sleep(STEP_DOWN - 0.001)
        assert leadership.lease_ok()
        await asyncio.sleep(0.002)
        assert not leadership.lease_ok()

    scenario(body)


def test_the_virtual_loop_reports_a_test_that_would_hang() -> None:
    async def forever() -> None:
        await asyncio.Event().wait()

    from testbed.virtual_time import Stuck

    with pytest.raises(Stuck):
        run(forever())
