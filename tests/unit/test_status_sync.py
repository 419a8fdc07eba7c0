"""The status sync's fan-out, with a fake API (pure logic: no process, no network)."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime
from typing import Any, cast

from schedlock.operator.sync import SYNC_CONCURRENCY, StatusSync
from schedlock.store import PublishRecord, Store


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
    store = cast(Store, None)  # one-shot rows need no database read
    sync = StatusSync(store, api, sweep_seconds=30, holder="t")
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
    store = cast(Store, None)
    sync = StatusSync(store, api, sweep_seconds=30, holder="t", known=index.get)
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
        cast(Store, None), api, sweep_seconds=30, holder="t", known=index.get,
        lost=lambda: woken.append(True),
    )  # fmt: skip
    reverted = dataclasses.replace(published(0), state="scheduled", attempts=0, term=None)
    asyncio.run(sync.sync_records([reverted]))
    assert api.phases == [] and woken == [True]  # the status keeps its outcome
    # A newer generation (an update re-armed it) back in `scheduled` is news: reflected.
    index["uid-o0"] = {"metadata": {**meta, "generation": 2}, "status": status}
    asyncio.run(sync.sync_records([dataclasses.replace(reverted, generation=2)]))
    assert api.phases == ["Scheduled"] and woken == [True]
