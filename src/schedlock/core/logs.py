"""Structured logging: one JSON object per line on stderr (or plain text for people).

Fields are stable: ``ts`` (RFC 3339 UTC, milliseconds, ``Z``), ``level``, ``logger``, ``msg``,
``event`` (what happened, one of :class:`Event`: read this, never the message text, which is
for people and may change), plus whatever a call passes in ``extra={...}``.  Exceptions become
``exc`` (type and message) and ``trace``.  Every product log call passes
``extra={"event": Event.X, ...}``; records from libraries have no ``event``.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from enum import StrEnum
from typing import Any

from schedlock.core.identities import rfc3339_epoch

# kopf attaches its whole settings object and internal flags to every record: not for logs.
_DROPPED = frozenset({"settings", "k8s_skip"})
_RESERVED = frozenset(vars(logging.makeLogRecord({})).keys()) | {"message", "asctime", "taskName"}


class Event(StrEnum):
    """The ``event`` field of every product log record (documented in docs/operations.md)."""

    # any process: supervised task groups (schedlock.core.aio)
    TASK_FAILED = "task_failed"
    TASK_CANCELLED = "task_cancelled"
    TASK_RESTARTED = "task_restarted"
    # sidecar: process
    SIDECAR_STARTED = "sidecar_started"
    SIDECAR_FATAL = "sidecar_fatal"
    SHUTDOWN_REQUESTED = "shutdown_requested"
    SIDECAR_STOPPED = "sidecar_stopped"
    # sidecar: leadership (per lock key)
    LEADERSHIP_ACQUIRED = "leadership_acquired"
    LEADERSHIP_RELEASED = "leadership_released"
    LEADERSHIP_HANDED_OVER = "leadership_handed_over"
    LOCK_SESSION_LOST = "lock_session_lost"
    CONNECTIONS_REFUSED = "connections_refused"
    # sidecar: the app
    TARGET_REACHABLE = "target_reachable"
    TARGET_UNREACHABLE = "target_unreachable"
    TARGET_CHECK_CRASHED = "target_check_crashed"
    # sidecar: firing
    LISTEN_FAILED = "listen_failed"
    SCHEDULE_UNPARSABLE = "schedule_unparsable"
    SLOTS_SKIPPED = "slots_skipped"
    DELIVERY_CRASHED = "delivery_crashed"
    DELIVERY_NOT_PUBLISHED = "delivery_not_published"
    ROW_RETURNED = "row_returned"
    # store
    DATABASE_SCHEMA_NEWER = "database_schema_newer"
    DATABASE_NOT_READY = "database_not_ready"
    DATABASE_NOT_USABLE = "database_not_usable"
    MIGRATION_APPLIED = "migration_applied"
    MIGRATION_REVERTED = "migration_reverted"
    NOTIFICATIONS_STOPPED = "notifications_stopped"
    NOTIFICATION_GARBLED = "notification_garbled"
    # store: retention (any contender: sidecar or operator)
    HISTORY_PRUNED = "history_pruned"
    PRUNE_FAILED = "prune_failed"
    PRUNE_NOT_PERMITTED = "prune_not_permitted"
    # operator
    OPERATOR_STARTED = "operator_started"
    OPERATOR_STOPPED = "operator_stopped"
    STATUS_SYNC_ACTIVE = "status_sync_active"
    STATUS_SYNC_INTERRUPTED = "status_sync_interrupted"
    STATUS_SYNC_FAILED = "status_sync_failed"
    STATUS_SYNC_RESUMED = "status_sync_resumed"
    STATUS_SYNC_LOOKUPS_BOUNDED = "status_sync_lookups_bounded"
    KUBE_EVENT_FAILED = "kube_event_failed"
    ROWS_REASSERTED = "rows_reasserted"
    REASSERT_READ_ONLY = "reassert_read_only"
    REASSERT_FAILED = "reassert_failed"


def records(text: str, *events: Event) -> Iterator[dict[str, Any]]:
    """The JSON records in a log's ``text`` (other lines skipped), only ``events`` if given."""
    wanted = {str(e) for e in events}
    for line in text.splitlines():
        if not line.startswith("{"):
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a kill
        if isinstance(record, dict) and (not wanted or record.get("event") in wanted):
            yield record


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": rfc3339_epoch(record.created, "milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key in _RESERVED or key.startswith("_") or key in _DROPPED:
                continue
            if isinstance(value, str | int | float | bool | list | dict | type(None)):
                entry[key] = value
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            entry["exc"] = f"{type(exc).__name__}: {exc}"
            entry["trace"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """For people: the message, then the structured fields as key=value."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extras = [
            f"{key}={value}"
            for key, value in vars(record).items()
            if key not in _RESERVED
            and key not in _DROPPED
            and not key.startswith("_")
            and isinstance(value, str | int | float | bool)
        ]
        return f"{line} {' '.join(extras)}" if extras else line


def configure(level: str = "info", fmt: str = "json") -> None:
    """Install one stderr handler on the root logger (idempotent)."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Third-party chatter stays at warnings unless we debug: kopf's two info lines per object
    # and handler run ("Handler 'upsert' succeeded.", "Creation is processed …") cost CPU in a
    # burst and say less than the object's Events and status.
    for noisy in ("aiohttp.access", "kubernetes", "urllib3", "asyncio", "kopf"):
        logging.getLogger(noisy).setLevel(logging.WARNING if level != "debug" else logging.DEBUG)
