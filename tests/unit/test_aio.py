"""The async kit (``schedlock.core.aio``), on virtual time: exact, and in no real time."""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import logging
import pkgutil
import random
import re
from collections.abc import Coroutine
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import schedlock
from schedlock.core import aio
from schedlock.core.aio import (
    Backoff,
    Companion,
    RateLimit,
    SingleFlight,
    Supervisor,
    TaskSet,
    TaskSlot,
    Toggle,
    now,
    sleep_unless,
    unless_set,
    utcnow,
)
from testbed.virtual_time import run


def set_in(event: asyncio.Event, seconds: float) -> asyncio.TimerHandle:
    return asyncio.get_running_loop().call_later(seconds, event.set)


def test_sleep_unless_sleeps_the_time_or_until_an_event() -> None:
    async def body() -> None:
        stop, other = asyncio.Event(), asyncio.Event()
        t0 = now()
        assert await sleep_unless(5, stop, other) is False
        assert now() - t0 == 5
        set_in(other, 2)
        assert await sleep_unless(5, stop, other) is True
        assert now() - t0 == 7
        assert await sleep_unless(5, other) is True and now() - t0 == 7, "already set: at once"
        assert await sleep_unless(0, stop) is False
        set_in(stop, 100)
        assert await sleep_unless(None, stop) is True and now() - t0 == 107

    run(body())


def test_unless_set_returns_the_result_or_cancels_and_hands_a_late_result_back() -> None:
    async def body() -> None:
        stop = asyncio.Event()

        async def takes(seconds: float) -> str:
            await asyncio.sleep(seconds)
            return f"after {seconds}"

        done = await unless_set(takes(1), stop)
        assert done is not None and done.value == "after 1"
        set_in(stop, 1)
        assert await unless_set(takes(5), stop) is None
        assert now() == pytest.approx(1002)

        abandoned: list[str] = []

        async def granted_anyway() -> str:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                return "a lock granted just too late"
            return "never"

        async def abandon(value: str) -> None:
            abandoned.append(value)

        stop.clear()
        set_in(stop, 1)
        assert await unless_set(granted_anyway(), stop, abandon=abandon) is None
        assert abandoned == ["a lock granted just too late"]

    run(body())


def test_the_backoff_doubles_to_its_cap_with_jitter_and_resets() -> None:
    backoff = Backoff(0.5, 10.0, random.Random(7))
    bases, delays = [], []
    for _ in range(8):
        bases.append(backoff.base)
        delays.append(backoff.next())
    assert bases == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0, 10.0]
    assert all(0.5 * b <= d < 1.5 * b for b, d in zip(bases, delays, strict=True))
    assert len({d / b for b, d in zip(bases, delays, strict=True)}) == len(bases), "jittered"
    backoff.reset()
    assert backoff.base == 0.5


def test_a_supervisor_logs_every_failure_and_raises_the_first(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="schedlock.aio")
    cancelled: list[str] = []

    async def fails(seconds: float, exc: Exception) -> None:
        await asyncio.sleep(seconds)
        raise exc

    async def waits() -> None:
        try:
            await asyncio.sleep(100)
        except asyncio.CancelledError:
            cancelled.append("waits")
            raise

    async def group() -> None:
        async with Supervisor("group", expected=(KeyError,)) as tasks:
            tasks.start("one", fails(1, KeyError("first")))
            # Fails in the same instant, before the group has cancelled it.
            tasks.start("two", fails(1, ValueError("second")))
            tasks.start("three", waits())

    async def body() -> None:
        with pytest.raises(KeyError, match="first"):
            await group()

    run(body())
    failed = [(r.task, r.levelno) for r in caplog.records if r.event == "task_failed"]  # type: ignore[attr-defined]
    assert failed == [("one", logging.INFO), ("two", logging.ERROR)], "every failure, by name"
    assert cancelled == ["waits"], "the first failure cancels the rest"


def test_a_supervisor_stops_in_stages_and_cancels_what_overstays(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="schedlock.aio")
    ended: dict[str, float] = {}

    async def polite(stopping: asyncio.Event, name: str, cleanup: float) -> None:
        await stopping.wait()
        try:
            await asyncio.sleep(cleanup)
        finally:
            ended[name] = now()

    async def body() -> None:
        stopping = asyncio.Event()
        t0 = now()
        set_in(stopping, 1)
        async with Supervisor("group", stopping=stopping, stop_timeout=5) as group:
            group.start("quick", polite(stopping, "quick", 2))
            group.start("slow", polite(stopping, "slow", 60))
        assert ended == {"quick": t0 + 3, "slow": t0 + 6}, "the slow one cut at stop + 5 s"
        assert now() == t0 + 6

    run(body())
    late = [r.task for r in caplog.records if r.event == "task_cancelled"]  # type: ignore[attr-defined]
    assert late == ["slow"]


def test_a_supervised_task_is_restarted_with_backoff_and_is_down_meanwhile(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="schedlock.aio")
    runs: list[float] = []
    seen: list[tuple[float, str | None]] = []

    async def dies_three_times(stopping: asyncio.Event) -> None:
        runs.append(now())
        if len(runs) <= 3:
            await asyncio.sleep(1)
            raise OverflowError("cannot convert float infinity to integer")
        await stopping.wait()

    async def body() -> None:
        stopping = asyncio.Event()
        t0 = now()
        async with Supervisor("operator", stopping=stopping, stop_timeout=5) as group:
            group.supervise(
                "status-sync", lambda: dies_three_times(stopping), Backoff(2, 8, random.Random(1))
            )
            for _ in range(40):
                await asyncio.sleep(0.5)
                seen.append((now(), group.health()))
            stopping.set()
        assert now() - t0 == pytest.approx(20), "stopped at once: the task ends on a stop"

    run(body())
    gaps = [b - a - 1 for a, b in itertools.pairwise(runs)]
    assert len(runs) == 4, "restarted after each of its three failures, then kept running"
    assert all(0.5 * base <= g < 1.5 * base for g, base in zip(gaps, [2, 4, 8], strict=True)), (
        f"the back-off doubles between restarts: {gaps}"
    )
    first = next(h for _, h in seen if h is not None)
    assert first.startswith("task status-sync failed (OverflowError), restart 1 in "), first
    assert seen[-1][1] is None, "up again once restarted"
    for t, health in seen:
        # down exactly between a failure (start + 1 s) and the next start
        expected = any(a + 1 <= t < b for a, b in itertools.pairwise(runs))
        assert (health is not None) == expected, (t, health, runs)
    failed = [r for r in caplog.records if r.event == "task_failed"]  # type: ignore[attr-defined]
    assert [(r.task, r.restarts, r.levelno) for r in failed] == [  # type: ignore[attr-defined]
        ("status-sync", 1, logging.ERROR),
        ("status-sync", 2, logging.ERROR),
        ("status-sync", 3, logging.ERROR),
    ]
    assert all(r.exc_info for r in failed), "logged with the traceback"
    restarted = [r.restarts for r in caplog.records if r.event == "task_restarted"]  # type: ignore[attr-defined]
    assert restarted == [1, 2, 3]


def test_a_supervised_task_that_ran_a_while_restarts_from_the_first_delay() -> None:
    runs: list[float] = []

    async def dies_after(seconds: float) -> None:
        runs.append(now())
        await asyncio.sleep(seconds)
        raise RuntimeError("gone")

    async def body() -> None:
        stopping = asyncio.Event()
        lengths = iter([1, 1, 100, 1000])

        async with Supervisor("group", stopping=stopping, stop_timeout=1) as group:
            group.supervise(
                "flaky", lambda: dies_after(next(lengths)), Backoff(1, 4, random.Random(3))
            )
            await asyncio.sleep(200)
            stopping.set()

    run(body())
    gaps = [b - a for a, b in itertools.pairwise(runs)]
    # 1 s run + ~1 s, 1 s run + ~2 s, then a 100 s run: back to ~1 s, not ~4 s
    assert 0.5 <= gaps[2] - 100 < 1.5, gaps


def test_a_stop_during_a_restart_delay_ends_the_group_at_once() -> None:
    async def fails() -> None:
        raise ValueError("bad")

    async def body() -> None:
        stopping = asyncio.Event()
        t0 = now()
        set_in(stopping, 3)
        async with Supervisor("group", stopping=stopping, stop_timeout=10) as group:
            group.supervise("fails", fails, Backoff(60, 60))
        assert now() - t0 == 3
        assert group.health() is None

    run(body())


def test_a_fatal_error_of_a_supervised_task_is_not_retried_but_ends_the_group() -> None:
    class Unsafe(Exception):
        pass

    runs: list[float] = []

    async def unsafe() -> None:
        runs.append(now())
        await asyncio.sleep(1)
        raise Unsafe("cannot run safely")

    async def body() -> None:
        async with Supervisor("electors") as group:
            group.supervise("elector", unsafe, Backoff(1, 2), fatal=(Unsafe,))

    with pytest.raises(Unsafe):
        run(body())
    assert len(runs) == 1


def test_a_rate_limit_says_yes_once_per_interval() -> None:
    limit = RateLimit(60)
    assert [limit.ready(t) for t in (0, 1, 59.9, 60, 61, 200)] == [
        True, False, False, True, False, True,
    ]  # fmt: skip


def failures(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    """The ``task_failed`` records: (task, error)."""
    return [(r.task, r.error) for r in caplog.records if r.event == "task_failed"]  # type: ignore[attr-defined]


async def until_cancelled(seen: list[tuple[str, float]]) -> None:
    """Run until cancelled, noting in ``seen`` when it started and when it ended."""
    seen.append(("start", now()))
    try:
        await asyncio.sleep(1000)
    finally:
        seen.append(("end", now()))


def test_a_supervisors_companion_is_cancelled_when_the_body_ends() -> None:
    beats: list[tuple[str, float]] = []
    checks: list[tuple[str, float]] = []

    async def body() -> None:
        t0 = now()
        async with Supervisor("term") as group:
            group.start("heartbeat", until_cancelled(beats), companion=True)
            group.supervise("check", lambda: until_cancelled(checks), Backoff(1, 2), companion=True)
            await asyncio.sleep(3)
        assert now() - t0 == 3, "the body's end ends its companions: the block does not wait"
        assert beats == checks == [("start", t0), ("end", t0 + 3)]

    run(body())


def test_a_companion_runs_beside_its_block_and_never_outlives_it() -> None:
    events: list[tuple[str, float]] = []

    async def body() -> None:
        t0 = now()
        async with Companion("listen", until_cancelled(events)) as listener:
            await asyncio.sleep(2)
            assert not listener.done()
            listener.check()  # running: nothing to raise
        assert events == [("start", t0), ("end", t0 + 2)]
        assert listener.task.cancelled()

    run(body())


def test_a_companions_failure_wakes_the_block_and_is_raised_there() -> None:
    async def fails_in(seconds: float) -> None:
        await asyncio.sleep(seconds)
        raise LookupError("the term moved on")

    async def noticed(wake: asyncio.Event) -> None:
        async with Companion("complete", fails_in(3), on_done=wake.set) as completer:
            assert await sleep_unless(60, wake) is True
            assert now() == 1003, "woken the moment it failed"
            completer.check()

    async def not_noticed() -> None:
        async with Companion("complete", fails_in(1)):
            await asyncio.sleep(5)

    async def body() -> None:
        with pytest.raises(LookupError, match="moved on"):
            await noticed(asyncio.Event())
        # Not noticed in the block: raised at its exit all the same.
        with pytest.raises(LookupError):
            await not_noticed()

    run(body())


def test_a_companions_failure_beside_the_blocks_own_is_logged_not_lost(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="schedlock.aio")

    async def fails() -> None:
        raise LookupError("listener broke")

    async def block() -> None:
        async with Companion("listen", fails()):
            await asyncio.sleep(1)
            raise ValueError("the block's own error")

    async def body() -> None:
        with pytest.raises(ValueError, match="the block's"):
            await block()

    run(body())
    assert failures(caplog) == [("listen", "LookupError: listener broke")]


def test_a_companion_stopped_early_is_cancelled_there() -> None:
    async def body() -> None:
        async with Companion("complete", asyncio.sleep(100)) as completer:
            await asyncio.sleep(1)
            await completer.stop()
            assert completer.task.cancelled()
            t1 = now()
            await asyncio.sleep(1)
        assert now() - t1 == 1

    run(body())


def test_a_task_set_drains_within_the_grace_and_cancels_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="schedlock.aio")
    ended: dict[str, tuple[str, float]] = {}

    async def work(name: str, seconds: float) -> None:
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            ended[name] = ("cancelled", now())
            raise
        if name == "bad":
            raise RuntimeError("a bug")
        ended[name] = ("done", now())

    async def body() -> None:
        freed: list[float] = []
        tasks = TaskSet("deliveries", on_done=lambda: freed.append(now()))
        t0 = now()
        for name, seconds in (("quick", 2), ("bad", 1), ("slow", 60)):
            tasks.start(f"fire:{name}", work(name, seconds))
        assert len(tasks) == 3
        await asyncio.sleep(1.5)
        assert len(tasks) == 2 and freed == [t0 + 1], "a slot is freed as a task ends"
        await tasks.drain(5)
        assert now() - t0 == 6.5, "the grace, not a second more"
        assert ended == {"quick": ("done", t0 + 2), "slow": ("cancelled", t0 + 6.5)}
        assert len(tasks) == 0
        again = tasks.start("fire:again", work("again", 10))
        await asyncio.sleep(1)
        await tasks.drain()
        assert ended["again"] == ("cancelled", t0 + 7.5), "no grace: cancelled at once"
        assert again.cancelled() and len(tasks) == 0

    run(body())
    assert failures(caplog) == [("fire:bad", "RuntimeError: a bug")]


def test_a_task_slot_holds_one_task_stopped_and_started_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="schedlock.aio")
    runs: list[tuple[str, float]] = []

    def pump() -> Coroutine[Any, Any, None]:
        return until_cancelled(runs)

    async def broken_pump() -> None:
        raise KeyError("a listener's bug")

    async def body() -> None:
        slot = TaskSlot("notifies:demo")
        t0 = now()
        slot.start(pump)
        slot.start(pump)  # one runs already: no second
        await asyncio.sleep(1)
        assert slot.running()
        await slot.stop()
        assert not slot.running() and runs == [("start", t0), ("end", t0 + 1)]
        slot.start(pump)
        await asyncio.sleep(1)
        await slot.stop()
        assert runs[2:] == [("start", t0 + 1), ("end", t0 + 2)]
        await slot.stop()  # empty: nothing to do
        slot.start(broken_pump)
        await asyncio.sleep(0)
        assert not slot.running()
        slot.start(pump)  # the slot's task ended (failed): a new one starts
        assert slot.running()
        await slot.stop()

    run(body())
    assert failures(caplog) == [("notifies:demo", 'KeyError: "a listener\'s bug"')]


def test_a_single_flight_shares_one_run_among_concurrent_callers() -> None:
    runs: list[float] = []

    async def check() -> float:
        runs.append(now())
        await asyncio.sleep(2)
        return now()

    async def body() -> None:
        flight: SingleFlight[float] = SingleFlight("confirm")
        t0 = now()
        first = asyncio.gather(*(flight(check) for _ in range(5)))
        await asyncio.sleep(1)
        late = await flight(check)  # joins the run under way
        assert await first == [t0 + 2] * 5 and late == t0 + 2
        assert runs == [t0], "one run for all six callers"
        assert await flight(check) == t0 + 4, "the run ended: the next call runs again"
        assert runs == [t0, t0 + 2]

    run(body())


def test_a_single_flight_outlives_a_cancelled_caller_and_shares_its_error() -> None:
    async def fails() -> None:
        await asyncio.sleep(2)
        raise ConnectionError("refused")

    async def body() -> None:
        flight: SingleFlight[None] = SingleFlight("confirm")
        impatient = asyncio.ensure_future(flight(fails))
        await asyncio.sleep(1)
        impatient.cancel()
        with pytest.raises(ConnectionError):
            await flight(fails)  # still the first run: it was not cancelled with its caller
        assert now() == pytest.approx(1002)
        with pytest.raises(asyncio.CancelledError):
            await impatient

    run(body())


def test_a_toggle_has_exactly_one_of_its_events_set() -> None:
    async def body() -> None:
        toggle = Toggle()
        assert not toggle.is_on() and toggle.off.is_set() and not toggle.on.is_set()
        asyncio.get_running_loop().call_later(3, toggle.turn, True)
        t0 = now()
        assert await sleep_unless(None, toggle.on) is True and now() - t0 == 3
        assert toggle.is_on() and not toggle.off.is_set()
        assert toggle.turn(True) is False, "already on"
        assert toggle.turn(False) is True
        assert toggle.off.is_set() and not toggle.on.is_set()
        assert Toggle(on=True).is_on()

    run(body())


def test_utcnow_is_the_system_clock_or_the_virtual_loops() -> None:
    before = datetime.now(UTC)
    assert before <= utcnow() <= datetime.now(UTC), "no loop: the system's clock"

    async def body() -> None:
        t0, wall0 = now(), utcnow()
        await asyncio.sleep(3600)
        assert utcnow() - wall0 == timedelta(seconds=now() - t0) == timedelta(hours=1)

    run(body())

    async def real() -> tuple[datetime, datetime, datetime]:
        return datetime.now(UTC), utcnow(), datetime.now(UTC)

    low, read, high = asyncio.run(real())
    assert low <= read <= high, "a real loop: the system's clock, read afresh"


def product_sources() -> dict[str, str]:
    """Every module of the product by its import name, wherever its file lies."""
    found: dict[str, str] = {}
    for module in pkgutil.walk_packages(schedlock.__path__, "schedlock."):
        spec = importlib.util.find_spec(module.name)
        assert spec is not None and spec.origin is not None, module.name
        found[module.name] = Path(spec.origin).read_text()
    return found


def test_only_the_kit_starts_tasks() -> None:
    """One lifecycle: start, failure and stop of every task are written in the kit."""
    sources = product_sources()
    assert "schedlock.sidecar.firing" in sources and "schedlock.operator.sync" in sources
    starting = re.compile(r"\b(create_task|ensure_future)\(")
    assert [name for name, text in sources.items() if starting.search(text)] == [aio.__name__]


def test_the_loops_read_no_clock_but_the_kits() -> None:
    """One clock: the sidecar and the operator take time from ``now()`` and ``utcnow()`` (the
    stores' own clocks stand for the database's)."""
    reading = re.compile(r"\b(datetime\.now|datetime\.utcnow|time\.time|time\.monotonic)\(")
    found = [
        name
        for name, text in product_sources().items()
        if name.startswith(("schedlock.sidecar.", "schedlock.operator.")) and reading.search(text)
    ]
    assert found == []
