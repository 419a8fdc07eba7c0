"""An idle leader listening on its lock session and a standby waiting for the lock are woken by
their socket, not by a timer: psycopg checks for a Ctrl-C every 0.1 s while it waits, which
was most of an idle sidecar's CPU (10 wake-ups a second per session).  Real PostgreSQL; the
wake-ups are counted as the timers the loop is asked for while the sessions wait."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from schedlock.store import Channel, LockKey, TargetLock, open_store
from testbed.pg_fixtures import SIDECAR_ROLE, as_role

KEYS = (LockKey("publish", "default", "quiet"), LockKey("recurring", "default", "quiet"))
IDLE_SECONDS = 3.0


def test_an_idle_leader_and_a_waiting_standby_are_not_woken_by_a_timer(
    migrated_database: str,
) -> None:
    async def run() -> int:
        loop = asyncio.get_running_loop()
        timers = 0
        call_later = loop.call_later

        def counting(delay: float, callback: Callable[..., object], *args: Any) -> Any:
            nonlocal timers
            timers += 1
            return call_later(delay, callback, *args)

        store = open_store(as_role(migrated_database, SIDECAR_ROLE))
        target = TargetLock(KEYS)
        leader = store.lock_session(KEYS[0], "quiet-leader", 15, target)
        standby = store.lock_session(KEYS[0], "quiet-standby", 15, target)
        await leader.connect()
        await standby.connect()
        assert await leader.take_standby_place(1) == 0
        await leader.acquire()
        await leader.leave_standby_place()
        for key in KEYS:
            keyed = await leader.lock_key(key)
            assert keyed is not None
            await keyed.listen(Channel.ROWS, lambda _payload: None)
        assert await standby.take_standby_place(1) == 0
        waiting = asyncio.create_task(standby.acquire(lambda _holder: None))
        await asyncio.sleep(0.5)  # the pump and the wait are under way
        setattr(loop, "call_later", counting)  # noqa: B010 (a method of this one loop, typed apart)
        try:
            await asyncio.sleep(IDLE_SECONDS)
        finally:
            setattr(loop, "call_later", call_later)  # noqa: B010
        assert not waiting.done()
        await leader.close()  # the standby is granted the lock
        await asyncio.wait_for(waiting, 15)
        await standby.close()
        await store.close()
        return timers

    timers = asyncio.run(run())
    # The sleep above is one timer.  psycopg's default would add about 30 for each of the two
    # waiting sessions (every 0.1 s); the sessions wait on their sockets instead.
    assert timers <= 5, timers
