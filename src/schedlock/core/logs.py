"""Structured logging: one JSON object per line on stderr (or plain text for people).

Fields are stable: ``ts`` (RFC 3339 UTC, milliseconds, ``Z``), ``level``, ``logger``, ``msg``,
``event`` (what happened, one of :class:`Event`: read this, never the message text, which is
for people and may change), plus whatever a call passes in ``extra={...}``.  Exceptions become
``exc`` (type and message) and ``trace``.  Every product log call passes
``extra={"event": Event.X, ...}``; records from libraries have no ``event``.

Every record, the product's and the libraries' alike (a driver's pool logs its connection
errors itself), is scrubbed of the process's secrets and of anything that looks like a password
in a URL or a ``key=value`` pair (``schedlock.core.redact``) before it is written.  The text
format escapes control characters (an app's answer with ESC or BEL in it, a name with a
newline, cannot colour a terminal or forge a line); JSON escapes them by nature, and here also
the C1 controls, direction marks and lone surrogates it would write as they are.
"""

from __future__ import annotations

import json
import logging
import sys
import traceback
from collections.abc import Iterable, Iterator
from enum import StrEnum
from typing import Any

from schedlock.core.identities import rfc3339_epoch
from schedlock.core.redact import Scrubber, json_printable, printable

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
    LOCK_HELD_BY_FOREIGN_ROLE = "lock_held_by_foreign_role"
    LOCK_FOREIGN_HOLDER_GONE = "lock_foreign_holder_gone"
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
    OPERATOR_FATAL = "operator_fatal"
    OBJECTS_LISTED = "objects_listed"
    DEEP_OBJECTS_UNREADABLE = "deep_objects_unreadable"
    STATUS_SYNC_ACTIVE = "status_sync_active"
    STATUS_SYNC_INTERRUPTED = "status_sync_interrupted"
    STATUS_SYNC_FAILED = "status_sync_failed"
    STATUS_SYNC_RESUMED = "status_sync_resumed"
    STATUS_SYNC_LOOKUPS_BOUNDED = "status_sync_lookups_bounded"
    KUBE_EVENT_FAILED = "kube_event_failed"
    POD_NOT_INJECTED = "pod_not_injected"
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


def _fields(record: logging.LogRecord) -> Iterator[tuple[str, Any]]:
    """A record's own fields (``extra={...}``): not logging's, not private, not kopf's."""
    for key, value in vars(record).items():
        if key not in _RESERVED and key not in _DROPPED and not key.startswith("_"):
            yield key, value


class _Scrubbing(logging.Formatter):
    """A formatter that scrubs every text of a record (see the module docstring)."""

    def __init__(self, fmt: str | None = None, secrets: Iterable[str] = ()) -> None:
        super().__init__(fmt)
        self.scrub = Scrubber(secrets)

    def _clean(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.scrub(value)
        if isinstance(value, list):
            return [self._clean(v) for v in value]
        if isinstance(value, dict):
            return {k: self._clean(v) for k, v in value.items()}
        return value


class JsonFormatter(_Scrubbing):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": rfc3339_epoch(record.created, "milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": self.scrub(record.getMessage()),
        }
        for key, value in _fields(record):
            if isinstance(value, str | int | float | bool | list | dict | type(None)):
                entry[key] = self._clean(value)
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            entry["exc"] = self.scrub(f"{type(exc).__name__}: {exc}")
            entry["trace"] = self.scrub(self.formatException(record.exc_info))
        return json_printable(json.dumps(entry, default=str, ensure_ascii=False))


class TextFormatter(_Scrubbing):
    """For people: the message, then the structured fields as key=value; every text printable."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s", secrets)

    def format(self, record: logging.LogRecord) -> str:
        record.message = printable(self.scrub(record.getMessage()))
        line = f"{self.formatTime(record)} {record.levelname:<7} {record.name}: {record.message}"
        extras = [
            f"{key}={printable(self.scrub(str(value)))}"
            for key, value in _fields(record)
            if isinstance(value, str | int | float | bool)
        ]
        if extras:
            line = f"{line} {' '.join(extras)}"
        if record.exc_info and record.exc_info[1] is not None:
            error = traceback.TracebackException.from_exception(record.exc_info[1])
            line += "".join(f"\n{printable(self.scrub(part))}" for part in _trace_lines(error))
        if record.stack_info:
            lines = self.formatStack(record.stack_info).splitlines()
            line += "".join(f"\n{printable(self.scrub(part))}" for part in lines)
        return line


_CAUSE = ["", "The above exception was the direct cause of the following exception:", ""]
_CONTEXT = ["", "During handling of the above exception, another exception occurred:", ""]


def _trace_lines(error: traceback.TracebackException) -> Iterator[str]:
    """A traceback as its lines, each exception's message one line of its own: a message with
    a newline in it (an app's answer, a server's text) cannot forge the next log line."""
    if error.__cause__ is not None:
        yield from _trace_lines(error.__cause__)
        yield from _CAUSE
    elif error.__context__ is not None and not error.__suppress_context__:
        yield from _trace_lines(error.__context__)
        yield from _CONTEXT
    if error.stack:
        yield "Traceback (most recent call last):"
        for frame in error.stack.format():
            yield from frame.rstrip("\n").split("\n")
    yield "".join(error.format_exception_only()).rstrip("\n")


def configure(level: str = "info", fmt: str = "json", secrets: Iterable[str] = ()) -> None:
    """Install one stderr handler on the root logger (idempotent); ``secrets`` (the spellings
    of the process's passwords, ``schedlock.core.redact.secrets_of``) never reach it."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter(secrets=secrets))
    else:
        handler.setFormatter(TextFormatter(secrets))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Third-party chatter stays at warnings unless we debug: kopf's two info lines per object
    # and handler run ("Handler 'upsert' succeeded.", "Creation is processed …") cost CPU in a
    # burst and say less than the object's Events and status.
    for noisy in ("aiohttp.access", "kubernetes", "urllib3", "asyncio", "kopf"):
        logging.getLogger(noisy).setLevel(logging.WARNING if level != "debug" else logging.DEBUG)
