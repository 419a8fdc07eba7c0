"""Structured logging: one JSON object per line on stderr (or plain text for people).

Fields are stable: ``ts`` (RFC 3339 UTC), ``level``, ``logger``, ``msg``, plus whatever a call
passes in ``extra={...}``.  Exceptions become ``exc`` (type and message) and ``trace``.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

# kopf attaches its whole settings object and internal flags to every record: not for logs.
_DROPPED = frozenset({"settings", "k8s_skip"})
_RESERVED = frozenset(vars(logging.makeLogRecord({})).keys()) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
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
