"""Pure mapping between ScheduledPublish objects and database rows (no I/O, ``now`` passed in).

* :func:`desired` turns an object into the row spec to upsert (keyed by uid + generation).
* :func:`status_for_publish` / :func:`status_for_schedule` turn rows back into ``.status``.
* :func:`conditions` writes the whole ``conditions`` list, keeping ``lastTransitionTime`` when
  a condition's status did not change.
* :func:`event_for` decides which Event (if any) a status change deserves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from schedlock.core import identities
from schedlock.core.payloads import PayloadError, check_payload
from schedlock.core.scheduling import ScheduleError, parse_schedule
from schedlock.operator.crd import DEFAULT_BACKOFF_SECONDS, DEFAULT_MAX_ATTEMPTS
from schedlock.store import PublishRecord, PublishSpec, RowState, ScheduleRecord, ScheduleSpec

PHASES: dict[str, str] = {state: state.title() for state in RowState}  # row state -> phase


class InvalidSpec(ValueError):
    """The object cannot be turned into a row; the message tells the user what to fix."""


def rfc3339(value: datetime | None) -> str | None:
    if value is None:
        return None
    return identities.rfc3339(value, "seconds")


def parse_rfc3339(text: str) -> datetime:
    try:
        parsed = identities.parse_rfc3339(text)
    except ValueError:
        raise InvalidSpec(f"spec.publishAt {text!r} is not an RFC 3339 date-time") from None
    if parsed.tzinfo is None:
        raise InvalidSpec(f"spec.publishAt {text!r} needs a time zone offset or Z")
    return parsed.astimezone(UTC)


def payload_problem(payload: Any) -> str | None:
    """Why a payload is refused (None: fine). Shared by the webhook and the handlers, and
    the same check as the CLI's and the database's (schedlock.core.payloads)."""
    if payload is None:
        return None
    try:
        check_payload(payload)
    except PayloadError as exc:
        return f"spec.{exc}"
    return None


def spec_problems(spec: Mapping[str, Any]) -> list[str]:
    """Semantic checks the schema cannot express (the webhook refuses on these)."""
    problems = []
    problem = payload_problem(spec.get("payload"))
    if problem:
        problems.append(problem)
    if spec.get("schedule"):
        try:
            parse_schedule(str(spec["schedule"]), str(spec.get("timeZone") or "UTC"))
        except ScheduleError as exc:
            problems.append(f"spec.schedule: {exc}")
    return problems


def desired(body: Mapping[str, Any]) -> PublishSpec | ScheduleSpec:
    meta = body["metadata"]
    spec = body.get("spec") or {}
    problems = spec_problems(spec)
    if problems:
        raise InvalidSpec("; ".join(problems))
    retry = spec.get("retry") or {}
    common: dict[str, Any] = {
        "namespace": meta["namespace"],
        "name": meta["name"],
        "uid": meta["uid"],
        "target": spec["target"],
        "payload": dict(spec.get("payload") or {}),
        "generation": int(meta.get("generation") or 1),
        "max_attempts": int(retry.get("maxAttempts", DEFAULT_MAX_ATTEMPTS)),
        "backoff_seconds": float(retry.get("backoffSeconds", DEFAULT_BACKOFF_SECONDS)),
        "starting_deadline_seconds": spec.get("startingDeadlineSeconds"),
        "suspended": bool(spec.get("suspend", False)),
    }
    if spec.get("schedule"):
        return ScheduleSpec(
            expression=str(spec["schedule"]),
            time_zone=str(spec.get("timeZone") or "UTC"),
            **common,
        )
    if not spec.get("publishAt"):
        raise InvalidSpec("set exactly one of spec.publishAt or spec.schedule")
    return PublishSpec(due_at=parse_rfc3339(str(spec["publishAt"])), **common)


@dataclass(frozen=True)
class Ready:
    status: str  # "True" | "False" | "Unknown"
    reason: str
    message: str


def _ready_in(conditions: Sequence[Mapping[str, Any]] | None) -> Mapping[str, Any] | None:
    return next((c for c in conditions or [] if c.get("type") == "Ready"), None)


def ready_condition(status: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The status's Ready condition (None: it has none yet)."""
    return _ready_in(status.get("conditions"))


def conditions(
    previous: Sequence[Mapping[str, Any]] | None, ready: Ready, generation: int, now: datetime
) -> list[dict[str, Any]]:
    """The whole conditions list; lastTransitionTime moves only when the status changes."""
    old = _ready_in(previous)
    transitioned = old is None or old.get("status") != ready.status
    when = rfc3339(now) if transitioned or not old else old.get("lastTransitionTime")
    kept = [dict(c) for c in previous or [] if c.get("type") != "Ready"]
    return [
        *kept,
        {
            "type": "Ready",
            "status": ready.status,
            "reason": ready.reason,
            "message": ready.message,
            "lastTransitionTime": when,
            "observedGeneration": generation,
        },
    ]


def _ready_for_row(state: str, record: PublishRecord | None) -> Ready:
    error = (record.last_error if record else None) or ""
    if state == RowState.PUBLISHED:
        return Ready("True", "Published", "delivered to the app")
    if state == RowState.FAILED:
        return Ready("False", "Failed", error or "delivery failed")
    if state == RowState.MISSED:
        return Ready(
            "False", "Missed", error or "the starting deadline passed before it could fire"
        )
    if state == RowState.SUSPENDED:
        return Ready("False", "Suspended", "spec.suspend is true")
    if state == RowState.CANCELLED:
        return Ready("False", "Cancelled", "cancelled")
    if state == RowState.FIRING:
        return Ready("False", "Firing", "being delivered")
    if record is not None and record.attempts:
        return Ready("False", "Retrying", f"attempt {record.attempts} failed: {error}")
    return Ready("False", "Scheduled", "waiting for its time")


def status_for_publish(
    record: PublishRecord,
    previous: Mapping[str, Any] | None,
    generation: int,
    now: datetime,
) -> dict[str, Any]:
    previous = previous or {}
    fired = record.state in (RowState.PUBLISHED, RowState.FAILED) and record.fired_at is not None
    status: dict[str, Any] = {
        "phase": PHASES.get(record.state, "Pending"),
        "nextFireAt": rfc3339(record.next_attempt_at)
        if record.state == RowState.SCHEDULED
        else None,
        "lastFiredAt": rfc3339(record.fired_at) if fired else previous.get("lastFiredAt"),
        "attempts": record.attempts,
        "lastError": record.last_error,
        "firedBy": (
            {"term": record.term, "holder": record.holder}
            if record.term is not None and record.state != RowState.SCHEDULED
            else previous.get("firedBy")
        ),
        "observedGeneration": generation,
    }
    status["conditions"] = conditions(
        previous.get("conditions"), _ready_for_row(record.state, record), generation, now
    )
    return status


def status_for_schedule(
    schedule: ScheduleRecord,
    last_slot: PublishRecord | None,
    previous: Mapping[str, Any] | None,
    generation: int,
    now: datetime,
) -> dict[str, Any]:
    previous = previous or {}
    if schedule.state == "suspended":
        phase, ready = "Suspended", Ready("False", "Suspended", "spec.suspend is true")
    elif schedule.state == "cancelled":
        phase, ready = "Cancelled", Ready("False", "Cancelled", "cancelled")
    elif last_slot is not None and last_slot.state in (RowState.FAILED, RowState.MISSED):
        phase = "Scheduled"
        ready = _ready_for_row(last_slot.state, last_slot)
    else:
        phase = "Scheduled"
        ready = Ready(
            "True", "Scheduled", f"fires on {schedule.expression!r} ({schedule.time_zone})"
        )
    last_fired = None
    if (
        last_slot is not None
        and last_slot.fired_at is not None
        and last_slot.state == RowState.PUBLISHED
    ):
        last_fired = rfc3339(last_slot.fired_at)
    status: dict[str, Any] = {
        "phase": phase,
        "nextFireAt": rfc3339(schedule.next_slot_at) if phase == "Scheduled" else None,
        "lastFiredAt": last_fired or previous.get("lastFiredAt"),
        "attempts": last_slot.attempts if last_slot else 0,
        "lastError": last_slot.last_error if last_slot else None,
        "firedBy": (
            {"term": last_slot.term, "holder": last_slot.holder}
            if last_slot is not None and last_slot.term is not None
            else previous.get("firedBy")
        ),
        "observedGeneration": generation,
    }
    status["conditions"] = conditions(previous.get("conditions"), ready, generation, now)
    return status


def scheduled_status(
    spec: PublishSpec | ScheduleSpec, previous: Mapping[str, Any] | None, now: datetime
) -> dict[str, Any]:
    """The status right after an upsert, before any fire."""
    previous = previous or {}
    if spec.suspended:
        phase, ready = "Suspended", Ready("False", "Suspended", "spec.suspend is true")
    else:
        phase, ready = "Scheduled", Ready("False", "Scheduled", "waiting for its time")
    next_fire = None
    if isinstance(spec, PublishSpec) and not spec.suspended:
        next_fire = rfc3339(spec.due_at)
    elif isinstance(spec, ScheduleSpec) and not spec.suspended:
        schedule = parse_schedule(spec.expression, spec.time_zone)
        next_fire = rfc3339(schedule.next_after(now))
        ready = Ready("True", "Scheduled", f"fires on {spec.expression!r} ({spec.time_zone})")
    return {
        "phase": phase,
        "nextFireAt": next_fire,
        # as the sync has it for a row not fired yet: its sweep then finds nothing to patch
        "attempts": int(previous.get("attempts") or 0),
        "observedGeneration": spec.generation,
        "conditions": conditions(previous.get("conditions"), ready, spec.generation, now),
    }


@dataclass(frozen=True)
class EventSpec:
    type: str  # Normal | Warning
    reason: str
    message: str


def event_for(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> EventSpec | None:
    """The Event a status change deserves: one per fire outcome, none for a replay."""
    old = old or {}
    phase, error = new.get("phase"), new.get("lastError") or ""
    fired_again = new.get("lastFiredAt") and new.get("lastFiredAt") != old.get("lastFiredAt")
    by = new.get("firedBy") or {}
    who = f" by {by.get('holder')} (term {by.get('term')})" if by.get("holder") else ""
    if phase == "Published" and old.get("phase") != "Published":
        return EventSpec("Normal", "Published", f"delivered{who}")
    if fired_again and phase == "Scheduled" and not error:
        return EventSpec("Normal", "Published", f"slot delivered{who}")
    if phase == "Failed" and old.get("phase") != "Failed":
        return EventSpec("Warning", "Failed", error or "delivery failed")
    if phase == "Missed" and old.get("phase") != "Missed":
        return EventSpec("Warning", "Missed", error or "the starting deadline passed")
    last_reason = _ready_reason(new)
    if last_reason in ("Failed", "Missed") and _ready_reason(old) != last_reason:
        return EventSpec("Warning", last_reason, error or last_reason.lower())
    return None


def _ready_reason(status: Mapping[str, Any]) -> str | None:
    ready = ready_condition(status)
    return None if ready is None else str(ready.get("reason"))


def status_changed(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    """Whether a patch is needed (ignoring lastTransitionTime churn)."""
    old = old or {}
    return any(old.get(k) != v for k, v in new.items())
