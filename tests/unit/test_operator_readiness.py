"""The operator's ``/readyz`` (``schedlock.operator.process.Readiness``) follows its background
tasks: a task that died is down, and said by name, until the supervisor has restarted it."""

from __future__ import annotations

import asyncio
import random

from schedlock.core.aio import Backoff, Supervisor
from schedlock.operator.process import Readiness
from testbed.virtual_time import run


def test_readyz_fails_while_a_background_task_is_down_and_recovers_after_its_restart() -> None:
    said: list[tuple[bool, str]] = []

    async def body() -> None:
        readiness = Readiness()
        readiness.report_schema(None)
        readiness.kopf_ready.set()
        stopping = asyncio.Event()
        runs = 0

        async def sync() -> None:
            nonlocal runs
            runs += 1
            if runs == 1:
                await asyncio.sleep(10)
                raise OverflowError("cannot convert float infinity to integer")
            await stopping.wait()

        async with Supervisor("operator", stopping=stopping, stop_timeout=5) as tasks:
            readiness.tasks = tasks
            tasks.supervise("status-sync", sync, Backoff(4, 30, random.Random(2)))
            for _ in range(20):
                said.append(readiness())
                await asyncio.sleep(1)
            stopping.set()

    run(body())
    assert said[0] == (True, "ready")
    down = [text for ok, text in said if not ok]
    assert down, "not ready while the sync was down"
    assert down[0].startswith(
        "background task down: task status-sync failed (OverflowError), restart 1 in "
    ), down[0]
    assert said[-1] == (True, "ready"), "ready again once restarted"
