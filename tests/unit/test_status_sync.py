"""The status sync's fan-out, with a fake API (pure logic: no process, no network)."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

from schedlock.operator.sync import (
    SYNC_CONCURRENCY,
    SYNC_CURSOR,
    UNLISTED_GETS,
    KubeApi,
    Lookup,
    Pass,
    StatusSync,
    lookup,
    start_from,
)
from schedlock.store import SWEEP_PAGE, PublishRecord, ScheduleRecord, SweepPosition, SyncCursor
from testbed.memory_store import MemoryStore


class SlowApi:
    """Every call takes a moment; records the calls and how many objects were in flight."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.in_flight = 0
        self.most_in_flight = 0

    async def _call(self, what: str, name: str) -> None:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await asyncio.sleep(0.01)
        self.in_flight -= 1
        self.calls.append((what, name))

    async def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        await self._call("get", name)
        return {"metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"}}

    async def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        assert status["phase"] == "Published"
        await self._call("patch", name)

    async def post_event(
        self, obj: dict[str, Any], *, type_: str, reason: str, message: str
    ) -> None:
        assert reason == "Published"
        await self._call("event", obj["metadata"]["name"])


FIRED = datetime(2026, 12, 1, 10, 0, 0, 500000, tzinfo=UTC)  # one outcome, replayed: the same


def published(n: int) -> PublishRecord:
    now = FIRED
    return PublishRecord(
        id=n, scheduler="publish", namespace="ns", name=f"o{n}", uid=f"uid-o{n}", generation=1,
        target="demo", due_at=now, next_attempt_at=now, payload={}, state="published",
        attempts=1, max_attempts=5, term=1, holder="h", last_status=200, last_error=None,
        fired_at=now, finished_at=now,
    )  # fmt: skip


def test_a_burst_of_outcomes_is_synced_a_few_objects_at_a_time_each_in_order() -> None:
    api = SlowApi()
    store = MemoryStore()  # one-shot rows need no database read
    sync = StatusSync(store, api, sweep_seconds=30, holder="t", catch_up_seconds=3600)
    asyncio.run(sync.sync_records([published(n) for n in range(40)]))
    assert 1 < api.most_in_flight <= SYNC_CONCURRENCY
    for n in range(40):
        mine = [what for what, name in api.calls if name == f"o{n}"]
        assert mine == ["get", "patch", "event"]


def test_with_the_index_an_outcome_costs_a_patch_and_an_event_and_a_replay_nothing() -> None:
    api = SlowApi()
    index: dict[str, dict[str, Any]] = {
        f"uid-o{n}": {"metadata": {"name": f"o{n}", "namespace": "ns", "uid": f"uid-o{n}"}}
        for n in range(3)
    }
    store = MemoryStore()
    sync = StatusSync(
        store, api, sweep_seconds=30, holder="t", catch_up_seconds=3600, known=index.get
    )
    asyncio.run(sync.sync_records([published(n) for n in range(3)]))
    assert sorted(api.calls) == sorted(
        (what, f"o{n}") for n in range(3) for what in ("patch", "event")
    )
    # The same outcomes again before the watch shows the writes: the sync's own last write
    # stands for the status, so nothing is patched or posted twice.
    api.calls.clear()
    asyncio.run(sync.sync_records([published(n) for n in range(3)]))
    assert api.calls == []
    # The watch delivers o0's write (a new snapshot): the status in it says the same.
    [(_, written)] = [v for k, v in sync._written.items() if k == "uid-o0"]
    index["uid-o0"] = {**index["uid-o0"], "status": written}
    asyncio.run(sync.sync_records([published(0)]))
    assert api.calls == [] and "uid-o0" not in sync._written


class Patches:
    """Records the status patches (any phase) and posts nothing."""

    def __init__(self) -> None:
        self.phases: list[str] = []

    async def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        raise AssertionError("the index has the object")

    async def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.phases.append(status["phase"])

    async def post_event(
        self, obj: dict[str, Any], *, type_: str, reason: str, message: str
    ) -> None:
        pass


def test_a_row_back_in_scheduled_under_a_published_status_wakes_the_reassertion() -> None:
    api = Patches()
    status = {"phase": "Published", "observedGeneration": 1, "attempts": 1}
    meta = {"name": "o0", "namespace": "ns", "uid": "uid-o0", "generation": 1}
    index = {"uid-o0": {"metadata": meta, "status": status}}
    woken: list[bool] = []
    sync = StatusSync(
        MemoryStore(), api, sweep_seconds=30, holder="t", catch_up_seconds=3600,
        known=index.get, lost=lambda: woken.append(True),
    )  # fmt: skip
    reverted = dataclasses.replace(published(0), state="scheduled", attempts=0, term=None)
    asyncio.run(sync.sync_records([reverted]))
    assert api.phases == [] and woken == [True]  # the status keeps its outcome
    # A newer generation (an update re-armed it) back in `scheduled` is news: reflected.
    index["uid-o0"] = {"metadata": {**meta, "generation": 2}, "status": status}
    asyncio.run(sync.sync_records([dataclasses.replace(reverted, generation=2)]))
    assert api.phases == ["Scheduled"] and woken == [True]


def sync_of(
    api: KubeApi,
    index: dict[str, dict[str, Any]],
    *,
    listed: bool,
    store: MemoryStore | None = None,
) -> StatusSync:
    sync = StatusSync(
        store or MemoryStore(), api, sweep_seconds=30, holder="t", catch_up_seconds=3600,
        known=index.get, covers=lambda namespace: namespace == "ns",
    )  # fmt: skip
    if listed:
        sync.listed.set()
    return sync


def live(n: int) -> dict[str, dict[str, Any]]:
    return {f"uid-o{n}": {"metadata": {"name": f"o{n}", "namespace": "ns", "uid": f"uid-o{n}"}}}


def test_where_an_objects_status_comes_from() -> None:
    # in the index: the snapshot, listed or not
    assert lookup(indexed=True, listed=False, covered=False, seen_gone=False, gets_left=0) == (
        Lookup.INDEX
    )
    # not in a listed index that covers its namespace: gone, no request
    assert lookup(indexed=False, listed=True, covered=True, seen_gone=False, gets_left=9) == (
        Lookup.GONE
    )
    # before the listing, or a namespace the index does not watch: a GET, while the pass has any
    for listed, covered in ((False, True), (True, False), (False, False)):
        kw = {"indexed": False, "listed": listed, "covered": covered, "seen_gone": False}
        assert lookup(**kw, gets_left=1) == Lookup.GET
        assert lookup(**kw, gets_left=0) == Lookup.DEFERRED
        assert lookup(**{**kw, "seen_gone": True}, gets_left=1) == Lookup.GONE


def test_rows_of_objects_absent_from_the_listed_index_cost_no_request() -> None:
    api = SlowApi()
    sync = sync_of(api, live(0), listed=True)
    history = [published(n) for n in range(1, 2001)]  # 2,000 deleted objects' outcomes
    asyncio.run(sync.sync_records([*history, published(0)]))
    assert api.calls == [("patch", "o0"), ("event", "o0")], "no GET: only the live object"


def test_before_the_listing_an_object_the_index_lacks_is_read_with_a_get() -> None:
    api = SlowApi()
    sync = sync_of(api, {}, listed=False)
    asyncio.run(sync.sync_records([published(0)]))
    assert api.calls == [("get", "o0"), ("patch", "o0"), ("event", "o0")]


class Gone(SlowApi):
    async def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        await self._call("get", name)
        return None  # 404


def test_before_the_listing_gets_are_bounded_per_pass_and_a_gone_object_is_asked_once() -> None:
    api = Gone()
    sync = sync_of(api, {}, listed=False)
    pass_ = Pass()
    asyncio.run(sync.sync_records([published(n) for n in range(UNLISTED_GETS + 50)], pass_))
    assert len(api.calls) == UNLISTED_GETS and pass_.deferred == 50
    # the next page of the same pass: objects seen gone are not asked for again
    api.calls.clear()
    asyncio.run(sync.sync_records([published(n) for n in range(UNLISTED_GETS)], pass_))
    assert api.calls == []
    # a namespace the index does not watch is read with a GET even once listed
    sync.listed.set()
    other = dataclasses.replace(published(7777), namespace="elsewhere")
    asyncio.run(sync.sync_records([other, published(8888)]))
    assert api.calls == [("get", "o7777")]


def slot(schedule_uid: str, n: int) -> PublishRecord:
    return dataclasses.replace(
        published(n), scheduler="recurring", name="o0",
        uid=f"{schedule_uid}@2026-12-01T10:00:{n:02d}Z",
    )  # fmt: skip


def schedules() -> MemoryStore:
    """A store with one recurring row (``uid-o0``, its latest slot fired) and its slots."""
    store = MemoryStore()
    store.schedules["uid-o0"] = ScheduleRecord(
        id=1, uid="uid-o0", namespace="ns", name="o0", generation=1, target="demo",
        expression="* * * * *", time_zone="UTC", state="active", watermark_at=None,
        last_slot_at=FIRED, next_slot_at=None,
    )  # fmt: skip
    for n in (58, 59):
        store.put(slot("uid-o0", n), changed_at=FIRED)
    return store


def test_recurring_rows_cost_one_latest_slot_per_schedule_per_batch_and_none_when_gone() -> None:
    api, store = Patches(), schedules()  # Patches: a GET fails the test
    sync = sync_of(api, live(0), listed=True, store=store)
    live_slots = [slot("uid-o0", n) for n in range(30)]
    deleted_slots = [slot(f"uid-gone{g}", n) for g in range(20) for n in range(30)]
    asyncio.run(sync.sync_records([*live_slots, *deleted_slots]))
    reads = [(verb, args) for _, verb, args in store.reads]
    assert reads == [("get_schedule", "uid-o0"), ("latest_slot", "uid-o0")]
    assert len(api.phases) == 1  # the schedule's status, once


def test_a_run_starts_from_its_cursor_or_a_bounded_catch_up() -> None:
    stored = FIRED - timedelta(days=40)
    assert start_from(SyncCursor(watermark_at=stored, now=FIRED), 3600) == SweepPosition(stored)
    assert start_from(SyncCursor(watermark_at=None, now=FIRED), 3600) == SweepPosition(
        FIRED - timedelta(hours=1)
    )


def pages(count: int) -> MemoryStore:
    """A store with ``count`` full pages of rows changed ten minutes ago and after, no cursor."""
    store = MemoryStore(db_clock=lambda: FIRED)
    for page in range(1, count + 1):
        for n in range(SWEEP_PAGE):
            changed = FIRED - timedelta(minutes=10 - page)
            store.put(published(10_000 + page * SWEEP_PAGE + n), changed_at=changed)
    return store


def test_a_sweep_pages_from_the_cursor_and_stores_it_once_complete() -> None:
    api, store = SlowApi(), pages(2)
    sync = sync_of(api, {}, listed=True, store=store)
    asyncio.run(sync.sweep())
    read_from = [since for _, since in store.sweeps]
    assert [p.at for p in read_from] == [
        FIRED - timedelta(hours=1), FIRED - timedelta(minutes=9), FIRED - timedelta(minutes=8),
    ]  # fmt: skip
    assert read_from[1].after_id == 10_999  # a page goes on after the last row read
    assert store.cursors == {SYNC_CURSOR: FIRED - timedelta(seconds=5)}
    assert api.calls == []  # 1,000 rows of deleted objects: no request
    asyncio.run(sync.sweep())  # the next sweep goes on where this one ended, no cursor read
    assert store.sweeps[-1][1] == SweepPosition(FIRED - timedelta(seconds=5))
    assert len(store.cursor_reads) == 1
