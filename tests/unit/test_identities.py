"""Named identities: the slot uid, the RFC 3339 renderer, the scheduler names and log events."""

from __future__ import annotations

import ast
import json
import logging
import re
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from schedlock.core import logs
from schedlock.core.identities import (
    Scheduler,
    parse_rfc3339,
    parse_slot_uid,
    rfc3339,
    rfc3339_epoch,
    schedule_uid_of,
    scheduler_of,
    slot_uid,
)
from schedlock.core.logs import Event

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src" / "schedlock"
BERLIN = timezone(timedelta(hours=1))


def test_a_slot_uid_is_the_schedule_uid_and_the_slot_in_utc_microseconds() -> None:
    slot = datetime(2026, 1, 5, 9, 0, 0, 250000, tzinfo=UTC)
    assert slot_uid("3f1c-9a", slot) == "3f1c-9a@2026-01-05T09:00:00.250000Z"
    # a slot given in another zone is the same instant, so the same uid
    assert slot_uid("3f1c-9a", slot.astimezone(BERLIN)) == "3f1c-9a@2026-01-05T09:00:00.250000Z"


def test_a_slot_uid_parses_back_to_its_schedule_and_slot() -> None:
    slot = datetime(2026, 3, 29, 1, 30, tzinfo=UTC)
    uid = slot_uid("sched-1", slot)
    assert parse_slot_uid(uid) == ("sched-1", slot)
    assert schedule_uid_of(uid) == "sched-1"
    assert scheduler_of(uid) is Scheduler.RECURRING


@pytest.mark.parametrize(
    "uid", ["8d2b7c1e-5a4f-4d9e-b1c2-000000000001", "cli-1234", "x@not-a-time"]
)
def test_other_uids_are_not_slots(uid: str) -> None:
    if "@" not in uid:
        assert parse_slot_uid(uid) is None
        assert schedule_uid_of(uid) == uid
        assert scheduler_of(uid) is Scheduler.PUBLISH
    else:
        assert parse_slot_uid(uid) is None


@pytest.mark.parametrize(
    ("precision", "expected"),
    [
        ("seconds", "2026-12-01T08:00:05Z"),
        ("milliseconds", "2026-12-01T08:00:05.123Z"),
        ("microseconds", "2026-12-01T08:00:05.123456Z"),
        ("auto", "2026-12-01T08:00:05.123456Z"),
    ],
)
def test_rfc3339_is_utc_with_z_to_the_precision_asked(precision: str, expected: str) -> None:
    moment = datetime(2026, 12, 1, 9, 0, 5, 123456, tzinfo=BERLIN)
    assert rfc3339(moment, precision) == expected  # type: ignore[arg-type]
    assert parse_rfc3339(expected) == moment.replace(
        microsecond={"seconds": 0, "milliseconds": 123000}.get(precision, 123456)
    )


def test_rfc3339_auto_drops_zero_microseconds_and_refuses_naive_times() -> None:
    assert rfc3339(datetime(2026, 12, 1, 9, tzinfo=UTC)) == "2026-12-01T09:00:00Z"
    assert rfc3339_epoch(0.5) == "1970-01-01T00:00:00.500Z"
    with pytest.raises(ValueError, match="no time zone"):
        rfc3339(datetime(2026, 12, 1, 9))


def test_the_scheduler_names_are_the_stored_spellings() -> None:
    assert [s.value for s in Scheduler] == ["publish", "recurring"]
    assert f"{Scheduler.RECURRING}/ns/app" == "recurring/ns/app"


def test_json_records_carry_the_event_and_an_rfc3339_ts() -> None:
    record = logging.makeLogRecord(
        {
            "name": "schedlock.lock",
            "levelname": "INFO",
            "msg": "acquired leadership",
            "created": 1.25,
            "event": Event.LEADERSHIP_ACQUIRED,
            "term": 3,
        }
    )
    line = logs.JsonFormatter().format(record)
    entry = json.loads(line)
    assert entry["event"] == "leadership_acquired" and entry["term"] == 3
    assert entry["ts"] == "1970-01-01T00:00:01.250Z"
    text = f"noise\n{line}\n{line[:20]}\n" + json.dumps({"event": "other"})
    assert list(logs.records(text, Event.LEADERSHIP_ACQUIRED)) == [entry]
    assert len(list(logs.records(text))) == 2
    assert "event=leadership_acquired" in logs.TextFormatter().format(record)


def _log_calls(tree: ast.AST) -> list[ast.Call]:
    levels = {"debug", "info", "warning", "error", "exception", "critical", "log"}
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in levels
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "log"
    ]


def _event_of(call: ast.Call) -> str | None:
    for keyword in call.keywords:
        if keyword.arg == "extra" and isinstance(keyword.value, ast.Dict):
            for key, value in zip(keyword.value.keys, keyword.value.values, strict=True):
                named = isinstance(key, ast.Constant) and key.value == "event"
                if named and isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name):
                    return value.attr if value.value.id == "Event" else None
    return None


def test_every_product_log_call_names_its_event() -> None:
    calls = 0
    missing = []
    for path in sorted(SRC.rglob("*.py")):
        for call in _log_calls(ast.parse(path.read_text())):
            calls += 1
            name = _event_of(call)
            if name is None or name not in Event.__members__:
                missing.append(f"{path.relative_to(REPO)}:{call.lineno}")
    assert calls > 20, "the scan found the log calls"
    assert missing == [], "log calls without extra={'event': Event.X, ...}"


def test_every_event_is_documented() -> None:
    text = (REPO / "docs" / "operations.md").read_text()
    text = text.split("\n## Logs\n", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `([a-z_]+)` \|", text, re.M))
    assert documented == {e.value for e in Event}
