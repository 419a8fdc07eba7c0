"""The operator's pure mapping: objects -> rows, rows -> status, status changes -> Events."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from schedlock.operator import mapping
from schedlock.store import PublishRecord, PublishSpec, ScheduleRecord, ScheduleSpec

NOW = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


def body(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "n", "namespace": "ns", "uid": "u-1", "generation": 4},
        "spec": {"target": "app", **spec},
    }


def record(state: str, **extra: Any) -> PublishRecord:
    values: dict[str, Any] = {
        "id": 1,
        "scheduler": "publish",
        "namespace": "ns",
        "name": "n",
        "uid": "u-1",
        "generation": 4,
        "target": "app",
        "due_at": NOW,
        "next_attempt_at": NOW,
        "payload": {},
        "state": state,
        "attempts": 1,
        "max_attempts": 3,
        "term": 7,
        "holder": "pod-a",
        "last_status": 200,
        "last_error": None,
        "fired_at": NOW,
        "finished_at": NOW + timedelta(seconds=1),
    }
    values.update(extra)
    return PublishRecord(**values)


def test_one_shot_object_becomes_a_publish_row() -> None:
    spec = mapping.desired(
        body(
            publishAt="2026-12-01T10:00:00Z",
            payload={"a": 1},
            retry={"maxAttempts": 5, "backoffSeconds": 2},
            startingDeadlineSeconds=30,
            suspend=True,
        )
    )
    assert isinstance(spec, PublishSpec)
    assert spec.due_at == datetime(2026, 12, 1, 10, tzinfo=UTC)
    assert (spec.uid, spec.generation, spec.namespace, spec.target) == ("u-1", 4, "ns", "app")
    assert (spec.max_attempts, spec.backoff_seconds, spec.starting_deadline_seconds) == (5, 2.0, 30)
    assert spec.suspended and spec.payload == {"a": 1}


def test_recurring_object_becomes_a_schedule() -> None:
    spec = mapping.desired(body(schedule="0 3 * * *", timeZone="Europe/Berlin"))
    assert isinstance(spec, ScheduleSpec)
    assert (spec.expression, spec.time_zone, spec.max_attempts) == ("0 3 * * *", "Europe/Berlin", 3)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"publishAt": "2026-12-01T10:00:00Z", "payload": {"x": "y" * 17000}},
            "at most 16384 bytes",
        ),
        ({"schedule": "0 0 30 2 *"}, "spec.schedule"),
        ({"schedule": "0 3 * * *", "timeZone": "Mars/Base"}, "unknown time zone"),
        ({"publishAt": "soon"}, "not an RFC 3339"),
        ({}, "exactly one of"),
    ],
)
def test_invalid_specs_say_what_to_fix(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(mapping.InvalidSpec, match=message):
        mapping.desired(body(**spec))


def test_published_row_status() -> None:
    status = mapping.status_for_publish(record("published"), None, 4, NOW)
    assert status["phase"] == "Published"
    assert status["lastFiredAt"] == "2026-12-01T09:00:00Z"
    assert status["firedBy"] == {"term": 7, "holder": "pod-a"}
    assert status["nextFireAt"] is None
    [ready] = status["conditions"]
    assert (ready["type"], ready["status"], ready["reason"], ready["observedGeneration"]) == (
        "Ready",
        "True",
        "Published",
        4,
    )


def test_retrying_row_status_explains_the_last_error() -> None:
    status = mapping.status_for_publish(
        record("scheduled", last_error="HTTP 503 from app", last_status=503, fired_at=None),
        None,
        4,
        NOW,
    )
    assert status["phase"] == "Scheduled"
    assert status["conditions"][0]["reason"] == "Retrying"
    assert "HTTP 503" in status["conditions"][0]["message"]


def test_the_status_the_upsert_writes_is_the_one_the_sync_computes_for_the_row() -> None:
    """A sweep over a row not fired yet patches nothing (one status PATCH fewer per object)."""
    spec = mapping.desired(body(publishAt="2026-12-01T09:00:00Z"))
    written = mapping.scheduled_status(spec, None, NOW)
    row = record("scheduled", attempts=0, fired_at=None, term=None, holder=None)
    synced = mapping.status_for_publish(row, written, spec.generation, NOW + timedelta(minutes=1))
    assert not mapping.status_changed(written, synced)
    assert mapping.event_for(written, synced) is None


def test_last_transition_time_moves_only_on_change() -> None:
    first = mapping.status_for_publish(record("scheduled", attempts=0), None, 4, NOW)
    later = mapping.status_for_publish(
        record("scheduled", attempts=0), first, 4, NOW + timedelta(hours=1)
    )
    assert (
        later["conditions"][0]["lastTransitionTime"] == first["conditions"][0]["lastTransitionTime"]
    )
    assert not mapping.status_changed(first, later)
    done = mapping.status_for_publish(record("published"), later, 4, NOW + timedelta(hours=2))
    assert done["conditions"][0]["lastTransitionTime"] == "2026-12-01T11:00:00Z"


def test_events_once_per_outcome() -> None:
    scheduled = mapping.status_for_publish(record("scheduled", attempts=0), None, 4, NOW)
    published = mapping.status_for_publish(record("published"), scheduled, 4, NOW)
    event = mapping.event_for(scheduled, published)
    assert event is not None and (event.type, event.reason) == ("Normal", "Published")
    assert "pod-a (term 7)" in event.message
    assert mapping.event_for(published, published) is None  # a replay posts nothing
    failed = mapping.status_for_publish(
        record("failed", last_error="HTTP 404 from app"), scheduled, 4, NOW
    )
    event = mapping.event_for(scheduled, failed)
    assert event is not None and (event.type, event.reason) == ("Warning", "Failed")
    missed = mapping.status_for_publish(
        record("missed", attempts=0, fired_at=None), scheduled, 4, NOW
    )
    event = mapping.event_for(scheduled, missed)
    assert event is not None and event.reason == "Missed"


def test_recurring_status_and_slot_events() -> None:
    schedule = ScheduleRecord(
        id=1,
        uid="u-1",
        namespace="ns",
        name="n",
        generation=2,
        target="app",
        expression="*/5 * * * *",
        time_zone="UTC",
        state="active",
        watermark_at=NOW,
        last_slot_at=NOW,
        next_slot_at=NOW + timedelta(minutes=5),
    )
    before = mapping.status_for_schedule(schedule, None, None, 2, NOW)
    assert before["phase"] == "Scheduled" and before["nextFireAt"] == "2026-12-01T09:05:00Z"
    slot = record("published", scheduler="recurring", uid="u-1@2026-12-01T09:00:00.000000Z")
    after = mapping.status_for_schedule(schedule, slot, before, 2, NOW)
    assert after["lastFiredAt"] == "2026-12-01T09:00:00Z"
    event = mapping.event_for(before, after)
    assert event is not None and event.reason == "Published"
    failing = mapping.status_for_schedule(
        schedule, record("failed", scheduler="recurring", last_error="boom"), after, 2, NOW
    )
    assert failing["conditions"][0]["status"] == "False"
    event = mapping.event_for(after, failing)
    assert event is not None and (event.type, event.reason) == ("Warning", "Failed")


def test_a_deep_payload_is_refused_in_one_line_as_everywhere() -> None:
    payload: dict[str, Any] = {}
    for _ in range(3_000):  # the nesting: json.dumps alone would raise RecursionError
        payload = {"a": payload}
    assert mapping.spec_problems({"publishAt": "2026-12-01T10:00:00Z", "payload": payload}) == [
        "spec.payload nests deeper than 32 levels"
    ]
    with pytest.raises(mapping.InvalidSpec, match=r"^spec\.payload nests deeper than 32 levels$"):
        mapping.desired(body(publishAt="2026-12-01T10:00:00Z", payload=payload))


def test_a_row_failed_for_its_payload_posts_a_warning_with_the_reason() -> None:
    """The sidecar ends a row it cannot read failed; the status sync's normal outcome path
    turns that into the object's Warning Event."""
    reason = "payload nests deeper than 32 levels"
    firing = mapping.status_for_publish(record("firing", last_error=None), None, 4, NOW)
    failed = mapping.status_for_publish(
        record("failed", attempts=0, last_error=reason), firing, 4, NOW
    )
    assert failed["phase"] == "Failed" and failed["lastError"] == reason
    assert mapping.event_for(firing, failed) == mapping.EventSpec("Warning", "Failed", reason)
