"""An event loop on virtual time, for the in-process tests of the elector and the firing loop.

kopf's ``looptime`` is the model: the loop's clock is a number that jumps straight to the next
timer whenever nothing is ready to run, so ``asyncio.sleep(8)``, ``asyncio.wait_for(…, 5)``
and every wait of ``schedlock.core.aio`` take no real time, and the loop's clock (``loop.time()``,
which the elector and the kit read) says exactly how much virtual time went by.  Only for
code that does no real I/O: a loop that would block with no timer pending raises instead of
hanging the test.

The loop keeps a wall clock too (``wall_time()``, which ``schedlock.core.aio.utcnow`` reads):
the real time when the loop was made, moved on by the virtual time since, so a product's
timestamps (a status's ``lastTransitionTime``, a row's deadline) follow the same clock.

``run(main())`` runs a coroutine on a fresh virtual-time loop, starting at ``START``;
``await quiet()`` returns once nothing more can run at this instant (the clock stands still).
"""

from __future__ import annotations

import asyncio
import math
import selectors
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
START = 1000.0


class Stuck(RuntimeError):
    """Nothing can ever run again: every task waits on something no timer will set."""


class _Selector(selectors.DefaultSelector):
    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self.loop = loop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)  # the loop's own wake-up pipe; no test does real I/O
        if ready or timeout == 0:
            return ready
        if self.loop.quiet_waiters:
            # Nothing can run at this instant: wake those waiting for that, before the clock
            # moves (their callbacks run in this same turn of the loop).
            waiters, self.loop.quiet_waiters = self.loop.quiet_waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)
            return []
        if timeout is None:
            raise Stuck("no task can run and no timer is pending: the test would hang")
        # Jump to the next timer, and always forward: a timeout below the clock's precision
        # (code that sleeps "the rest" until a deadline) must not leave the clock standing.
        self.loop.now = max(self.loop.now + timeout, math.nextafter(self.loop.now, math.inf))
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self.now = START
        self.wall_start = time.time()
        self.quiet_waiters: list[asyncio.Future[None]] = []
        super().__init__(_Selector(self))

    def time(self) -> float:
        return self.now

    def wall_time(self) -> float:
        """Unix seconds: the wall clock at the loop's making, moved on by its virtual time."""
        return self.wall_start + (self.now - START)

    def _run_once(self) -> None:
        # The loop runs timers due within its clock's resolution early; on a clock that only
        # moves when told, "the rest of the time until a deadline" would then never pass (a
        # busy loop).  So move to such a timer's time first: the clock is where it says.
        scheduled: list[asyncio.TimerHandle] = self._scheduled  # type: ignore[attr-defined]
        resolution: float = self._clock_resolution  # type: ignore[attr-defined]
        if scheduled and scheduled[0].when() <= self.now + resolution:
            self.now = max(self.now, scheduled[0].when())
        super()._run_once()  # type: ignore[misc]


async def quiet() -> None:
    """Wait until every task has done all it can at this instant: the clock does not move."""
    loop = asyncio.get_running_loop()
    if not isinstance(loop, VirtualTimeLoop):
        raise RuntimeError("quiet() needs the virtual-time loop (testbed.virtual_time.run)")
    waiter = loop.create_future()
    loop.quiet_waiters.append(waiter)
    await waiter


def run(main: Coroutine[Any, Any, T]) -> T:
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(main)
