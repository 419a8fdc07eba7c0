"""When the status sync (``schedlock.operator.sync``) runs, on virtual time with the in-memory
store (``testbed.memory_store``): a NOTIFY of outcomes is synced at once — not at the next
sweep — the sweep comes on its interval, a lost session is retried with the kit's back-off,
and a stop while waiting for the sync lock returns at once.  (``tests/e2e/test_operator.py`` checks the statuses themselves.)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from asyncio import Event
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from schedlock.core.aio import now
from schedlock.operator.sync import (
    LISTING_WAIT_SECONDS,
    SYNC_CURSOR,
    StatusSync,
)
from schedlock.store import SYNC_LOCK_OBJID, Channel, StoreUnavailable
from schedlock.store.models import OnPayload
from schedlock.store.verbs import SWEEP_OVERLAP
from testbed.memory_store import MemoryStore
from testbed.virtual_time import START, run

SWEEP = 30.0
DB_NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)  # the database clock at the virtual START


def db_time(at: float) -> datetime:
    """The database clock at the loop's time ``at``: it runs with virtual time."""
    return DB_NOW + timedelta(seconds=at - START)


def memory(**kwargs: Any) -> MemoryStore:
    return MemoryStore(db_clock=lambda: db_time(now()), **kwargs)


def sweeps(store: MemoryStore) -> list[float]:
    """When the sync swept (read the rows changed since its position)."""
    return [at for at, _ in store.sweeps]


def swept_from(store: MemoryStore) -> list[datetime]:
    return [since.at for _, since in store.sweeps]


def ids_read(store: MemoryStore) -> list[tuple[float, object]]:
    """The outcomes read by id: (when, ids)."""
    return [(at, ids) for at, verb, ids in store.reads if verb == "publishes_by_id"]


def notify(store: MemoryStore, payload: str | bytes) -> None:
    store.notify(Channel.OUTCOMES, payload)


def listening(store: MemoryStore) -> bool:
    return bool(store.listeners.get(Channel.OUTCOMES))


class NoApi:
    async def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None

    async def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        raise AssertionError("nothing to patch")

    async def post_event(
        self, obj: dict[str, Any], *, type_: str, reason: str, message: str
    ) -> None:
        raise AssertionError("nothing to post")


def start(
    store: MemoryStore, stopping: asyncio.Event, *, listed: bool = True
) -> tuple[StatusSync, asyncio.Task[None]]:
    sync = StatusSync(
        store, NoApi(), sweep_seconds=SWEEP, holder="op", catch_up_seconds=3600,
    )  # fmt: skip
    if listed:
        sync.listed.set()  # kopf has listed the objects
    return sync, asyncio.create_task(sync.run(stopping))


@contextlib.asynccontextmanager
async def syncing(store: MemoryStore, *, listed: bool = True) -> AsyncIterator[StatusSync]:
    """The status sync running on ``store`` for the block, stopped (within 5 s) at its end."""
    stopping = asyncio.Event()
    sync, task = start(store, stopping, listed=listed)
    try:
        yield sync
    finally:
        stopping.set()
        await asyncio.wait_for(task, 5)


async def until(predicate: Callable[[], bool]) -> None:
    async with asyncio.timeout(120):
        while not predicate():
            await asyncio.sleep(0.01)


def test_outcomes_are_synced_on_notify_at_once_and_swept_on_the_interval() -> None:
    async def body() -> None:
        store = memory()
        async with syncing(store) as sync:
            await until(lambda: sync.active and listening(store) and bool(store.sweeps))
            t0 = sweeps(store)[0]
            await asyncio.sleep(1)
            notified_at = now()
            notify(store, json.dumps({"ids": [7, 3]}))
            await until(lambda: bool(ids_read(store)))
            assert ids_read(store) == [(notified_at, [3, 7])], (
                "synced when notified, not at the sweep"
            )
            await asyncio.sleep(SWEEP)
            assert sweeps(store) == [t0, t0 + SWEEP], "and swept on its interval"
            assert store.held[0].pings == sweeps(store)
        assert store.held[0].closed and not sync.active

    run(body())


def test_a_lost_session_is_retried_after_a_backoff() -> None:
    async def body() -> None:
        store = memory(next_held_fails_ping=True)
        async with syncing(store):
            await until(lambda: len(store.held) == 2)
            lost_at = store.held[0].pings[0]
            # The kit's back-off: 1 s with jitter in [0.5, 1.5), then a new session.
            assert 0.5 <= sweeps(store)[1] - lost_at < 1.5
            assert store.held[0].closed

    run(body())


@dataclass
class ListenerDies(MemoryStore):
    """A store whose listening session ends 5 s after it listens."""

    async def listen(self, channel: str, on_payload: OnPayload, ready: Event | None = None) -> None:
        if ready is not None:
            ready.set()
        await asyncio.sleep(5)
        raise StoreUnavailable("the listening session ended")


def test_a_dead_listener_is_noticed_and_the_sync_starts_over() -> None:
    async def body() -> None:
        store, stopping = ListenerDies(db_clock=lambda: db_time(now())), asyncio.Event()
        _, task = start(store, stopping)
        await until(lambda: len(store.held) == 2)
        assert store.held[0].closed, "the session given up: a new one for a new listener"
        assert sweeps(store)[1] - sweeps(store)[0] < SWEEP + 2, "at the next wake-up"
        stopping.set()
        await asyncio.wait_for(task, 5)

    run(body())


def test_a_stop_while_waiting_for_the_sync_lock_returns_at_once() -> None:
    async def body() -> None:
        store = memory()
        other = await store.hold_lock(SYNC_LOCK_OBJID, "another-operator-sync")
        async with syncing(store) as sync:
            await asyncio.sleep(60)
            assert not sync.active and store.held == [other]
            stopped_at = now()
        assert now() == stopped_at

    run(body())


def test_without_a_cursor_the_sync_starts_a_bounded_catch_up_back_and_stores_one() -> None:
    async def body() -> None:
        store = memory()
        async with syncing(store):
            await until(lambda: len(store.sweeps) == 2)
            first, second = sweeps(store)
            read_at = store.cursor_reads[0].now
            assert swept_from(store)[0] == read_at - timedelta(hours=1), "not the epoch"
            # stored after each completed sweep, and each next sweep goes on from it
            assert swept_from(store)[1] == db_time(first) - SWEEP_OVERLAP
            stored = db_time(second) - SWEEP_OVERLAP
            await until(lambda: store.cursors.get(SYNC_CURSOR) == stored)
            assert len(store.cursor_reads) == 1  # read once per activation

    run(body())


def test_a_new_activation_resumes_from_the_stored_cursor() -> None:
    async def body() -> None:
        stored = DB_NOW - timedelta(days=30)  # however old: the rows since then are the work
        store = memory(next_held_fails_ping=True, cursors={SYNC_CURSOR: stored})
        async with syncing(store):
            await until(lambda: len(store.held) == 2 and len(store.sweeps) == 2)
            assert swept_from(store)[0] == stored
            # the first session ended after its sweep; the next one reads the cursor it stored
            after_first = db_time(sweeps(store)[0]) - SWEEP_OVERLAP
            assert [c.watermark_at for c in store.cursor_reads] == [stored, after_first]
            assert swept_from(store)[1] == after_first

    run(body())


def test_the_first_sweep_waits_for_the_listing_a_bounded_time() -> None:
    async def body() -> None:
        store = memory()
        async with syncing(store, listed=False) as sync:
            started = now()
            await asyncio.sleep(3)
            assert sweeps(store) == [], "not before kopf has listed the objects"
            sync.listed.set()
            await until(lambda: bool(store.sweeps))
            assert sweeps(store) == [pytest.approx(started + 3)]
        # no listing at all (no object in the cluster): the sweep goes on after the wait
        store = memory()
        async with syncing(store, listed=False):
            started = now()
            await until(lambda: bool(store.sweeps))
            assert sweeps(store) == [pytest.approx(started + LISTING_WAIT_SECONDS)]

    run(body())


def test_garbage_notifications_never_stop_the_sync_and_are_made_up_for_by_a_sweep() -> None:
    async def body() -> None:
        store, stopping = memory(), asyncio.Event()
        sync, task = start(store, stopping)
        await until(lambda: sync.active and listening(store) and bool(store.sweeps))
        await asyncio.sleep(5)
        # the attack: int(1e999) raised OverflowError and ended the sync task
        t1 = now()
        notify(store, '{"ids":[1e999]}')
        await until(lambda: len(store.sweeps) == 2)
        assert sweeps(store)[1] == t1, "garbage may hide outcomes: swept at once"
        # a flood costs one sweep a second, not one each
        for i in range(200):
            notify(store, b"\xff\xfe not utf-8" if i % 2 else '{"ids":[NaN, "x", [[1]]]}')
            await asyncio.sleep(0.01)
        assert sweeps(store)[1:] == pytest.approx([t1, t1 + 1, t1 + 2]), store.sweeps
        # good ids among bad ones are synced at once, the bad ones dropped
        notify(store, '{"ids":[7, 9223372036854775808, 1e999, -1]}')
        await until(lambda: bool(ids_read(store)))
        assert [ids for _, ids in ids_read(store)] == [[7]]
        assert not task.done() and sync.active, "still syncing"
        assert sync.garbled == 202
        stopping.set()
        await asyncio.wait_for(task, 5)

    run(body())
