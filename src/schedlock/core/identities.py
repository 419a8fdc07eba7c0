"""Named identities: each format other components read is defined here, once.

* :class:`Scheduler` — the two schedulers, each one lock key per (namespace, target).
* The **slot uid** of a recurring schedule's slot: ``<schedule uid>@<slot time>``, the time in
  RFC 3339 UTC with microseconds (``abc@2026-01-05T09:00:00.000000Z``).  The sidecar builds it
  (:func:`slot_uid`); the operator, the chaos checker and the demo read it back
  (:func:`parse_slot_uid`, :func:`schedule_uid_of`).
* **RFC 3339 timestamps** (:func:`rfc3339`): always UTC with the ``Z`` suffix; only the
  precision differs by use, and every use names it: ``seconds`` for Kubernetes status fields,
  ``milliseconds`` for log records and the CLI's tables, ``microseconds`` for slot uids,
  ``auto`` (microseconds when there are any) for the delivery's ``scheduledAt`` and the CLI's
  ``dueAt``.  :func:`parse_rfc3339` reads any of them (and ``+00:00`` offsets).
* The **CLI uid** of a row ``schedlock publish``/``schedule`` inserts: ``cli-<uuid4>``
  (:func:`cli_uid`).  No object stands behind it, so the operator's status sync skips it
  (:func:`is_cli_uid`); load generators that insert rows directly use the prefix for the same.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Literal

Precision = Literal["auto", "seconds", "milliseconds", "microseconds"]
SLOT_SEPARATOR = "@"
CLI_UID_PREFIX = "cli-"


class Scheduler(StrEnum):
    PUBLISH = "publish"  # one-shot rows
    RECURRING = "recurring"  # schedules, materialised slot by slot


def rfc3339(value: datetime, precision: Precision = "auto") -> str:
    """``value`` (timezone-aware) in UTC as RFC 3339 with ``Z``, to ``precision``."""
    if value.tzinfo is None:
        raise ValueError(f"{value!r} has no time zone")
    return value.astimezone(UTC).isoformat(timespec=precision).replace("+00:00", "Z")


def rfc3339_epoch(seconds: float, precision: Precision = "milliseconds") -> str:
    return rfc3339(datetime.fromtimestamp(seconds, UTC), precision)


def parse_rfc3339(text: str) -> datetime:
    """An ISO 8601 / RFC 3339 time (``Z`` or an offset); raises ``ValueError``."""
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def slot_uid(schedule_uid: str, slot: datetime) -> str:
    return f"{schedule_uid}{SLOT_SEPARATOR}{rfc3339(slot, 'microseconds')}"


def parse_slot_uid(uid: str) -> tuple[str, datetime] | None:
    """(schedule uid, slot time) of a slot uid; None for any other uid."""
    schedule, sep, when = uid.rpartition(SLOT_SEPARATOR)
    if not sep:
        return None
    try:
        return schedule, parse_rfc3339(when)
    except ValueError:
        return None


def schedule_uid_of(uid: str) -> str:
    """The schedule behind a slot uid (any other uid unchanged)."""
    return uid.split(SLOT_SEPARATOR, 1)[0]


def scheduler_of(uid: str) -> Scheduler:
    """Which scheduler fires a row, told by its uid alone (one-shot uids carry no ``@``:
    Kubernetes uids, CLI and demo uids never do)."""
    return Scheduler.RECURRING if SLOT_SEPARATOR in uid else Scheduler.PUBLISH


def cli_uid() -> str:
    """A new uid for a row the CLI inserts (no object behind it)."""
    import uuid  # with the platform module it loads, 0.2 MB that a sidecar never needs

    return f"{CLI_UID_PREFIX}{uuid.uuid4()}"


def is_cli_uid(uid: str) -> bool:
    """Whether a row's uid says it has no object behind it (see :func:`cli_uid`)."""
    return uid.startswith(CLI_UID_PREFIX)
