"""The re-assertion's decisions, pure: what differs between objects and rows, what to write."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

from schedlock.core.logs import Event
from schedlock.operator.reassert import (
    Reasserter,
    handled,
    lost_outcome,
    plan,
    recorded_outcome,
    snapshot,
    upsert_rule,
)
from schedlock.operator.settings import OperatorSettings
from schedlock.store import (
    PublishSpec,
    RecordedOutcome,
    RowVersion,
    ScheduleSpec,
    UpsertResult,
)
from testbed.memory_store import DB_EPOCH, MemoryStore, publish_record
from testbed.virtual_time import run

DUE = "2030-01-01T00:00:00Z"


def obj(
    uid: str = "u1",
    generation: int = 1,
    observed: int | None = 1,
    phase: str = "Scheduled",
    **spec: Any,
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if observed is not None:
        status["observedGeneration"] = observed
    return {
        "metadata": {"namespace": "ns", "name": uid, "uid": uid, "generation": generation},
        "spec": {"target": "app", "publishAt": DUE, **spec},
        "status": status,
    }


def row(uid: str = "u1", generation: int = 1, state: str = "scheduled") -> RowVersion:
    return RowVersion("publish", uid, generation, state)


def test_the_default_interval_brings_a_lost_row_back_within_a_minute() -> None:
    assert 0 < OperatorSettings().reassert_seconds <= 60


def test_rows_that_match_are_not_written() -> None:
    objects = [obj("a"), obj("b", phase="Published"), obj("c", schedule="@every 1m")]
    rows = [row("a"), row("b", state="published"), RowVersion("schedule", "c", 1, "active")]
    result = plan(objects, rows)
    assert result.writes == 0 and result.compared == 3


def test_a_missing_or_older_row_is_upserted() -> None:
    result = plan([obj("a"), obj("b", generation=3, observed=3)], [row("b", generation=2)])
    assert [s.uid for s in result.upserts] == ["a", "b"]
    assert all(isinstance(s, PublishSpec) for s in result.upserts)
    assert result.upserts[1].generation == 3


def test_a_missing_schedule_is_upserted_and_a_slot_row_is_not_its_row() -> None:
    result = plan([obj("c", schedule="@every 1m")], [row("c")])  # a publish row, same uid
    assert len(result.upserts) == 1 and isinstance(result.upserts[0], ScheduleSpec)


def test_a_terminal_object_is_restored_in_its_outcome_only_when_its_row_went_back() -> None:
    status = {
        "phase": "Published",
        "observedGeneration": 1,
        "attempts": 2,
        "lastFiredAt": "2026-12-01T10:00:00Z",
        "firedBy": {"term": 4, "holder": "pod-a"},
    }
    published = {**obj("a"), "status": status}
    missed = obj("m", phase="Missed")
    # Rows gone behind a recorded outcome (pruned after the retention, or lost): done, nothing
    # written.  Restoring would undo every prune; upserting would fire them again.
    gone = plan([published, missed], [])
    assert gone.writes == 0 and gone.compared == 2
    # A row a restore put back in `scheduled` (or `suspended`) gets the outcome back.
    result = plan([published, missed], [row("a"), row("m", state="suspended")])
    assert result.upserts == []
    restored = {spec.uid: outcome for spec, outcome in result.restores}
    assert restored["a"] == RecordedOutcome(
        "published",
        attempts=2,
        fired_at=datetime(2026, 12, 1, 10, tzinfo=UTC),
        term=4,
        holder="pod-a",
    )
    assert restored["m"].state == "missed"
    assert plan([published], [row("a", state="published")]).writes == 0
    assert plan([published], [row("a", state="firing")]).writes == 0  # the leader owns it
    assert plan([published], [row("a", generation=2)]).writes == 0  # newer than the object


def test_the_upsert_handler_writes_nothing_behind_an_outcome_of_this_generation() -> None:
    spec = PublishSpec(
        namespace="ns",
        name="a",
        uid="a",
        target="app",
        generation=2,
        due_at=datetime(2030, 1, 1, tzinfo=UTC),
    )
    fired_now = {"phase": "Published", "observedGeneration": 2}
    fired_before = {"phase": "Failed", "observedGeneration": 1}
    same_time = {"target": "app", "publishAt": DUE}
    moved = {"target": "app", "publishAt": "2030-01-02T00:00:00Z"}
    # A resume (operator restart) of a fired object: its row may be pruned, nothing to write.
    assert upsert_rule(fired_now, spec, same_time) == "skip"
    assert upsert_rule(fired_now, spec, None) == "skip"
    # A payload edit after firing keeps the outcome (a pruned row is stored in it).
    assert upsert_rule(fired_before, spec, same_time) == "keep"
    # A new time re-arms; an unknown last spec or no outcome is the usual upsert.
    assert upsert_rule(fired_before, spec, moved) == "write"
    assert upsert_rule(fired_before, spec, None) == "write"
    assert upsert_rule(fired_before, spec, {"publishAt": "not a time"}) == "write"
    assert upsert_rule({"phase": "Scheduled", "observedGeneration": 2}, spec, same_time) == "write"
    assert upsert_rule({"phase": "Cancelled", "observedGeneration": 2}, spec, same_time) == "write"


def test_objects_the_handlers_are_not_done_with_are_left_to_them() -> None:
    being_deleted = obj("d")
    being_deleted["metadata"]["deletionTimestamp"] = "2026-12-01T10:00:00Z"
    objects = [
        obj("new", observed=None),  # the create handler has not run yet
        obj("upd", generation=2, observed=1),  # an update in progress
        being_deleted,
        obj("bad", publishAt="tomorrow"),  # invalid: the handler reported it
    ]
    assert not any(handled(o) for o in objects[:3])
    result = plan(objects, [])
    assert result.writes == 0 and result.compared == 0


def test_the_snapshot_is_a_plain_copy() -> None:
    body = obj("a")
    copy = snapshot(body)
    body["spec"]["target"] = "changed"
    assert copy["spec"]["target"] == "app"
    assert set(copy) == {"metadata", "spec", "status"}
    assert recorded_outcome({"phase": "Scheduled"}) is None
    assert recorded_outcome({"phase": "Failed", "lastError": "HTTP 400"}) == RecordedOutcome(
        "failed", last_error="HTTP 400"
    )


def test_a_row_back_in_scheduled_under_a_recorded_outcome_has_lost_it() -> None:
    published = obj("a", phase="Published")
    assert lost_outcome(published, 1, "scheduled")
    assert lost_outcome(published, 1, "suspended")
    assert not lost_outcome(published, 1, "published")  # it says the same
    assert not lost_outcome(published, 1, "firing")  # the leader owns it
    assert not lost_outcome(published, 2, "scheduled")  # a newer generation: news
    assert not lost_outcome(obj("a"), 1, "scheduled")  # no outcome recorded
    assert not lost_outcome(obj("a", generation=2, phase="Published"), 2, "scheduled")  # updating


def test_a_wake_runs_the_next_pass_at_once_not_an_interval_later() -> None:
    rows = MemoryStore()
    rows.put(publish_record(1, "a", state="published"), changed_at=DB_EPOCH)

    async def main() -> list[float]:
        stopping = asyncio.Event()
        reasserter = Reasserter(
            rows, lambda: [obj("a", phase="Published")], interval=60,
            wanted=lambda _uid: True,
        )  # fmt: skip
        task = asyncio.create_task(reasserter.run(stopping))
        await asyncio.sleep(10)
        reasserter.wake()
        await asyncio.sleep(1)
        stopping.set()
        await task
        return [at for at, verb, _ in rows.reads if verb == "row_versions"]

    first, woken = run(main())
    assert woken - first == 10  # at the wake, not at the 60 s interval


def test_objects_whose_rows_agree_are_compared_without_mapping_them(monkeypatch: Any) -> None:
    """A pass over objects whose rows agree maps none of them to a row spec (which checks the
    whole payload): only the ones it writes are."""
    from schedlock.operator import mapping

    mapped: list[str] = []
    desired = mapping.desired

    def counting(body: Any) -> Any:
        mapped.append(body["metadata"]["uid"])
        return desired(body)

    monkeypatch.setattr(mapping, "desired", counting)
    agreeing = [obj("a"), obj("b", phase="Published"), obj("c", schedule="@every 1m")]
    rows = [row("a"), row("b", state="published"), RowVersion("schedule", "c", 1, "active")]
    assert plan([*agreeing, obj("lost")], rows).compared == 4
    assert mapped == ["lost"]


class WritesRecorded(MemoryStore):
    """Keeps no rows: records what a pass writes, through which verb."""

    def __init__(self, during_write: Callable[[], None]) -> None:
        super().__init__()
        self.during_write = during_write
        self.batches: list[list[str]] = []
        self.cancelled: list[str] = []

    async def upsert_many(self, specs: Sequence[PublishSpec | ScheduleSpec]) -> list[UpsertResult]:
        self.batches.append([s.uid for s in specs])
        self.during_write()
        return [UpsertResult(id=i, state="scheduled", inserted=True) for i, _ in enumerate(specs)]

    async def cancel_publish(self, uid: str) -> bool:
        self.cancelled.append(uid)
        return True

    async def cancel_schedule(self, uid: str) -> int:
        self.cancelled.append(uid)
        return 1


def test_a_pass_writes_every_lost_row_in_one_call_and_none_of_a_deleted_object() -> None:
    """Lost rows go to the store in one ``upsert_many`` (batched there: one round trip per
    batch), not one upsert each; an object deleted before the write is skipped, one deleted
    during it has its row cancelled again."""
    gone = {"deleted-before"}
    store = WritesRecorded(during_write=lambda: gone.add("b"))  # b: deleted while written
    lost = [obj("a"), obj("b"), obj("c", schedule="@every 1m"), obj("deleted-before")]
    reasserter = Reasserter(store, lambda: lost, interval=60, wanted=lambda uid: uid not in gone)
    result = run(reasserter.once())
    assert store.batches == [["a", "b", "c"]]
    assert result.upserted == 3 and store.cancelled == ["b"]


def test_a_pass_that_wrote_logs_its_counts_and_uids(caplog: pytest.LogCaptureFixture) -> None:
    """One ``rows_reasserted`` warning per pass that wrote (docs/operations.md's fields); a pass
    with nothing to write logs nothing."""
    store = WritesRecorded(during_write=lambda: None)
    lost = [obj("a"), obj("b")]
    caplog.set_level(logging.INFO, "schedlock")
    run(Reasserter(store, lambda: lost, interval=60, wanted=lambda _uid: True).once())
    (line,) = [r for r in caplog.records if getattr(r, "event", None) == Event.ROWS_REASSERTED]
    assert line.levelno == logging.WARNING
    assert {k: getattr(line, k) for k in ("objects", "upserted", "restored_terminal", "uids")} == {
        "objects": 2,
        "upserted": 2,
        "restored_terminal": 0,
        "uids": ["a", "b"],
    }
    caplog.clear()
    run(Reasserter(store, list, interval=60, wanted=lambda _uid: True).once())
    assert not [r for r in caplog.records if getattr(r, "event", None) == Event.ROWS_REASSERTED]
