"""The async kit (``schedlock.core.aio``), on virtual time: exact, and in no real time."""

from __future__ import annotations

import asyncio
import itertools
import logging
import random

import pytest

from schedlock.core.aio import Backoff, RateLimit, Supervisor, now, sleep_unless, unless_set
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
