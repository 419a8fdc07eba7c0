"""When the status sync (``schedlock.operator.sync``) runs, on virtual time with a fake store:
a NOTIFY of outcomes is synced at once — not at the next sweep — the sweep comes on its
interval, a lost session is retried with the kit's back-off, and a stop while waiting for the
sync lock returns at once.  (``tests/e2e/test_operator.py`` checks the statuses themselves.)
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from schedlock.core.aio import now
from schedlock.operator.sync import LISTING_WAIT_SECONDS, StatusSync
from schedlock.store import PublishRecord, StoreUnavailable, SweepPosition, SyncCursor
from testbed.virtual_time import run

SWEEP = 30.0
DB_NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)  # the database clock the fake store answers


@dataclass
class Held:
    pings: list[float] = field(default_factory=list)
    closed: bool = False
    fail_ping: bool = False

    async def ping(self) -> None:
        self.pings.append(now())
        if self.fail_ping:
            raise StoreUnavailable("the sync's session ended")

    async def close(self) -> None:
        self.closed = True


@dataclass
class Store:
    """The operator's store as the sync uses it; ``granted`` gates the sync lock."""

    granted: asyncio.Event = field(default_factory=asyncio.Event)
    held: list[Held] = field(default_factory=list)
    notify: Callable[[str | bytes], None] | None = None
    sweeps: list[float] = field(default_factory=list)
    reads: list[tuple[float, list[int]]] = field(default_factory=list)
    fail_next_ping: bool = False
    cursor: datetime | None = None
    swept_from: list[datetime] = field(default_factory=list)
    cursor_reads: list[SyncCursor] = field(default_factory=list)

    async def hold_lock(self, objid: int, holder: str) -> Held:
        await self.granted.wait()
        self.held.append(Held(fail_ping=self.fail_next_ping))
        self.fail_next_ping = False
        return self.held[-1]

    async def listen(
        self,
        channel: str,
        on_payload: Callable[[str | bytes], None],
        ready: asyncio.Event | None = None,
    ) -> None:
        self.notify = on_payload
        if ready is not None:
            ready.set()
        await asyncio.get_running_loop().create_future()  # listens until cancelled

    async def sync_cursor(self, name: str) -> SyncCursor:
        self.cursor_reads.append(SyncCursor(watermark_at=self.cursor, now=DB_NOW))
        return self.cursor_reads[-1]

    async def store_sync_cursor(self, name: str, watermark_at: datetime, holder: str) -> None:
        self.cursor = watermark_at

    async def changed_since(
        self, since: SweepPosition
    ) -> tuple[list[PublishRecord], SweepPosition]:
        self.sweeps.append(now())
        self.swept_from.append(since.at)
        return [], SweepPosition(DB_NOW + timedelta(seconds=len(self.sweeps)))

    async def publishes_by_id(self, ids: list[int]) -> list[PublishRecord]:
        self.reads.append((now(), ids))
        return []


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
    store: Store, stopping: asyncio.Event, *, listed: bool = True
) -> tuple[StatusSync, asyncio.Task[None]]:
    sync = StatusSync(
        store, NoApi(), sweep_seconds=SWEEP, holder="op", catch_up_seconds=3600,  # type: ignore[arg-type]
    )  # fmt: skip
    if listed:
        sync.listed.set()  # kopf has listed the objects
    return sync, asyncio.create_task(sync.run(stopping))


async def until(predicate: Callable[[], bool]) -> None:
    async with asyncio.timeout(120):
        while not predicate():
            await asyncio.sleep(0.01)


def test_outcomes_are_synced_on_notify_at_once_and_swept_on_the_interval() -> None:
    async def body() -> None:
        store, stopping = Store(), asyncio.Event()
        store.granted.set()
        sync, task = start(store, stopping)
        await until(lambda: sync.active and store.notify is not None and bool(store.sweeps))
        t0 = store.sweeps[0]
        await asyncio.sleep(1)
        assert store.notify is not None
        notified_at = now()
        store.notify(json.dumps({"ids": [7, 3]}))
        await until(lambda: bool(store.reads))
        assert store.reads == [(notified_at, [3, 7])], "synced when notified, not at the sweep"
        await asyncio.sleep(SWEEP)
        assert store.sweeps == [t0, t0 + SWEEP], "and swept on its interval"
        assert store.held[0].pings == store.sweeps
        stopping.set()
        await asyncio.wait_for(task, 5)
        assert store.held[0].closed and not sync.active

    run(body())


def test_a_lost_session_is_retried_after_a_backoff() -> None:
    async def body() -> None:
        store, stopping = Store(fail_next_ping=True), asyncio.Event()
        store.granted.set()
        _, task = start(store, stopping)
        await until(lambda: len(store.held) == 2)
        lost_at = store.held[0].pings[0]
        # The kit's back-off: 1 s with jitter in [0.5, 1.5), then a new session.
        assert 0.5 <= store.sweeps[1] - lost_at < 1.5
        assert store.held[0].closed
        stopping.set()
        await asyncio.wait_for(task, 5)

    run(body())


def test_a_stop_while_waiting_for_the_sync_lock_returns_at_once() -> None:
    async def body() -> None:
        store, stopping = Store(), asyncio.Event()
        sync, task = start(store, stopping)
        await asyncio.sleep(60)
        assert not sync.active and store.held == []
        stopped_at = now()
        stopping.set()
        await asyncio.wait_for(task, 5)
        assert now() == stopped_at

    run(body())


def test_without_a_cursor_the_sync_starts_a_bounded_catch_up_back_and_stores_one() -> None:
    async def body() -> None:
        store, stopping = Store(), asyncio.Event()
        store.granted.set()
        _, task = start(store, stopping)
        await until(lambda: len(store.sweeps) == 2)
        assert store.swept_from[0] == DB_NOW - timedelta(hours=1), "not the epoch"
        # stored after each completed sweep, and each next sweep goes on from it
        assert store.swept_from[1] == DB_NOW + timedelta(seconds=1)
        await until(lambda: store.cursor == DB_NOW + timedelta(seconds=2))
        assert len(store.cursor_reads) == 1  # read once per activation
        stopping.set()
        await asyncio.wait_for(task, 5)

    run(body())


def test_a_new_activation_resumes_from_the_stored_cursor() -> None:
    async def body() -> None:
        stored = DB_NOW - timedelta(days=30)  # however old: the rows since then are the work
        store, stopping = Store(fail_next_ping=True, cursor=stored), asyncio.Event()
        store.granted.set()
        _, task = start(store, stopping)
        await until(lambda: len(store.held) == 2 and len(store.sweeps) == 2)
        assert store.swept_from[0] == stored
        # the first session ended after its sweep; the next one reads the cursor it stored
        assert [c.watermark_at for c in store.cursor_reads] == [
            stored,
            DB_NOW + timedelta(seconds=1),
        ]
        assert store.swept_from[1] == DB_NOW + timedelta(seconds=1)
        stopping.set()
        await asyncio.wait_for(task, 5)

    run(body())


def test_the_first_sweep_waits_for_the_listing_a_bounded_time() -> None:
    async def body() -> None:
        store, stopping = Store(), asyncio.Event()
        store.granted.set()
        sync, task = start(store, stopping, listed=False)
        started = now()
        await asyncio.sleep(3)
        assert store.sweeps == [], "not before kopf has listed the objects"
        sync.listed.set()
        await until(lambda: bool(store.sweeps))
        assert store.sweeps == [pytest.approx(started + 3)]
        stopping.set()
        await asyncio.wait_for(task, 5)
        # no listing at all (no object in the cluster): the sweep goes on after the wait
        store, stopping = Store(), asyncio.Event()
        store.granted.set()
        _, task = start(store, stopping, listed=False)
        started = now()
        await until(lambda: bool(store.sweeps))
        assert store.sweeps == [pytest.approx(started + LISTING_WAIT_SECONDS)]
        stopping.set()
        await asyncio.wait_for(task, 5)

    run(body())


def test_garbage_notifications_never_stop_the_sync_and_are_made_up_for_by_a_sweep() -> None:
    async def body() -> None:
        store, stopping = Store(), asyncio.Event()
        store.granted.set()
        sync, task = start(store, stopping)
        await until(lambda: sync.active and store.notify is not None and bool(store.sweeps))
        await asyncio.sleep(5)
        assert store.notify is not None
        # the attack: int(1e999) raised OverflowError and ended the sync task
        t1 = now()
        store.notify('{"ids":[1e999]}')
        await until(lambda: len(store.sweeps) == 2)
        assert store.sweeps[1] == t1, "garbage may hide outcomes: swept at once"
        # a flood costs one sweep a second, not one each
        for i in range(200):
            store.notify(b"\xff\xfe not utf-8" if i % 2 else '{"ids":[NaN, "x", [[1]]]}')
            await asyncio.sleep(0.01)
        assert store.sweeps[1:] == pytest.approx([t1, t1 + 1, t1 + 2]), store.sweeps
        # good ids among bad ones are synced at once, the bad ones dropped
        store.notify('{"ids":[7, 9223372036854775808, 1e999, -1]}')
        await until(lambda: bool(store.reads))
        assert [ids for _, ids in store.reads] == [[7]]
        assert not task.done() and sync.active, "still syncing"
        assert sync.garbled == 202
        stopping.set()
        await asyncio.wait_for(task, 5)

    run(body())
