"""Database rows -> store models, shared by both dialects (they differ only in how a timestamp
and a JSON payload come back from the driver, which the :class:`Codec` says)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from schedlock.store.models import (
    DueSchedule,
    FireRow,
    KeyStatus,
    PublishRecord,
    RowVersion,
    ScheduleRecord,
)

Row = Mapping[str, Any]


@dataclass(frozen=True)
class Codec:
    timestamp: Callable[[Any], datetime]
    payload: Callable[[Any], dict[str, Any]]

    def opt_timestamp(self, value: Any) -> datetime | None:
        return None if value is None else self.timestamp(value)


def _native_timestamp(value: Any) -> datetime:
    stamp: datetime = value
    return stamp.astimezone(UTC)


def _text_timestamp(value: Any) -> datetime:
    return datetime.fromisoformat(str(value)).astimezone(UTC)


POSTGRES = Codec(timestamp=_native_timestamp, payload=lambda v: dict(v or {}))
SQLITE = Codec(timestamp=_text_timestamp, payload=lambda v: dict(json.loads(v or "{}")))


def fire_row(r: Row, c: Codec) -> FireRow:
    return FireRow(
        id=int(r["id"]),
        uid=r["uid"],
        namespace=r["namespace"],
        name=r["name"],
        target=r["target"],
        due_at=c.timestamp(r["due_at"]),
        payload=c.payload(r["payload"]),
        attempt=int(r["attempts"]),
        max_attempts=int(r["max_attempts"]),
        backoff_seconds=float(r["backoff_seconds"]),
        starting_deadline_seconds=r["starting_deadline_seconds"],
        db_now=c.timestamp(r["db_now"]),
        orphan=bool(r["orphan"]),
    )


def publish_record(r: Row, c: Codec) -> PublishRecord:
    return PublishRecord(
        id=int(r["id"]),
        scheduler=r["scheduler"],
        namespace=r["namespace"],
        name=r["name"],
        uid=r["uid"],
        generation=int(r["generation"]),
        target=r["target"],
        due_at=c.timestamp(r["due_at"]),
        next_attempt_at=c.timestamp(r["next_attempt_at"]),
        payload=c.payload(r["payload"]),
        state=r["state"],
        attempts=int(r["attempts"]),
        max_attempts=int(r["max_attempts"]),
        term=r["term"],
        holder=r["holder"],
        last_status=r["last_status"],
        last_error=r["last_error"],
        fired_at=c.opt_timestamp(r["fired_at"]),
        finished_at=c.opt_timestamp(r["finished_at"]),
    )


def due_schedule(r: Row, c: Codec) -> DueSchedule:
    return DueSchedule(
        id=int(r["id"]),
        uid=r["uid"],
        namespace=r["namespace"],
        name=r["name"],
        target=r["target"],
        expression=r["expression"],
        time_zone=r["time_zone"],
        starting_deadline_seconds=r["starting_deadline_seconds"],
        watermark_at=c.opt_timestamp(r["watermark_at"]),
        db_now=c.timestamp(r["db_now"]),
    )


def key_status(
    r: Row,
    c: Codec,
    *,
    lock_holder: str | None,
    waiters: int,
    standbys: Sequence[str] = (),
    reserves: Sequence[str] = (),
) -> KeyStatus:
    return KeyStatus(
        scheduler=r["scheduler"],
        namespace=r["namespace"],
        target=r["target"],
        term=int(r["term"]),
        holder=r["holder"],
        lock_holder=lock_holder,
        waiters=waiters,
        since=c.opt_timestamp(r["since"]),
        heartbeat_at=c.opt_timestamp(r["heartbeat_at"]),
        released_at=c.opt_timestamp(r["released_at"]),
        backlog=int(r["backlog"]),
        next_due=c.opt_timestamp(r["next_due"]),
        last_fire=c.opt_timestamp(r["last_fire"]),
        standbys=tuple(standbys),
        reserves=tuple(reserves),
    )


def schedule_record(r: Row, c: Codec) -> ScheduleRecord:
    return ScheduleRecord(
        id=int(r["id"]),
        uid=r["uid"],
        namespace=r["namespace"],
        name=r["name"],
        generation=int(r["generation"]),
        target=r["target"],
        expression=r["expression"],
        time_zone=r["time_zone"],
        state=r["state"],
        watermark_at=c.opt_timestamp(r["watermark_at"]),
        last_slot_at=c.opt_timestamp(r["last_slot_at"]),
        next_slot_at=c.opt_timestamp(r["next_slot_at"]),
    )


def row_version(r: Row) -> RowVersion:
    return RowVersion(
        kind=str(r["kind"]), uid=str(r["uid"]), generation=int(r["generation"]), state=r["state"]
    )
