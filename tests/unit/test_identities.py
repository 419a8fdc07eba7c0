"""Named identities: the slot uid, the RFC 3339 renderer, the scheduler names and log events."""

from __future__ import annotations

import ast
import json
import logging
import re
from datetime import UTC, datetime, timedelta, timezone

import pytest

from schedlock.core import logs
from schedlock.core.identities import (
    Scheduler,
    cli_uid,
    is_cli_uid,
    parse_rfc3339,
    parse_slot_uid,
    rfc3339,
    rfc3339_epoch,
    schedule_uid_of,
    scheduler_of,
    slot_uid,
)
from schedlock.core.logs import Event
from testbed.layout import REPO, product_modules

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


def test_a_cli_uid_is_told_apart_from_an_objects_and_a_slots() -> None:
    """The operator's status sync skips the CLI's rows by their uid alone: no object has one."""
    uid = cli_uid()
    assert is_cli_uid(uid) and uid != cli_uid()
    assert scheduler_of(uid) is Scheduler.PUBLISH
    for other in ("8d2b7c1e-5a4f-4d9e-b1c2-000000000001", "abc@2026-01-05T09:00:00.000000Z"):
        assert not is_cli_uid(other)


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


def _log_calls(tree: ast.AST) -> list[tuple[ast.Call, set[str]]]:
    """Every ``log.<level>(...)`` call, with the names of its function's ``Event`` parameters."""
    levels = {"debug", "info", "warning", "error", "exception", "critical", "log"}
    found: list[tuple[ast.Call, set[str]]] = []

    def visit(node: ast.AST, event_params: set[str]) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
            event_params = {
                a.arg
                for a in args
                if isinstance(a.annotation, ast.Name) and a.annotation.id == "Event"
            }
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in levels
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "log"
        ):
            found.append((node, event_params))
        for child in ast.iter_child_nodes(node):
            visit(child, event_params)

    visit(tree, set())
    return found


def _event_of(call: ast.Call, event_params: set[str]) -> str | None:
    """The event a log call names: ``Event.X``, or a parameter typed ``Event`` (``_say``)."""
    for keyword in call.keywords:
        if keyword.arg == "extra" and isinstance(keyword.value, ast.Dict):
            for key, value in zip(keyword.value.keys, keyword.value.values, strict=True):
                if not (isinstance(key, ast.Constant) and key.value == "event"):
                    continue
                if isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name):
                    return value.attr if value.value.id == "Event" else None
                if isinstance(value, ast.Name) and value.id in event_params:
                    return "<parameter>"
    return None


def _event_arguments_of_helpers(tree: ast.AST, helpers: set[str]) -> list[tuple[int, bool]]:
    """Each call of a logging helper (a method taking an ``Event``): does it pass ``Event.X``?"""
    return [
        (
            node.lineno,
            any(
                (
                    isinstance(a, ast.Attribute)
                    and isinstance(a.value, ast.Name)
                    and a.value.id == "Event"
                    and a.attr in Event.__members__
                )
                # one helper forwarding its own ``event: Event`` parameter to another
                or (isinstance(a, ast.Name) and a.id == "event")
                for a in node.args
            ),
        )
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in helpers
    ]


def test_every_product_log_call_names_its_event() -> None:
    calls = 0
    missing = []
    for path in sorted(product_modules().values()):
        tree = ast.parse(path.read_text())
        helpers = {
            node.name
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef)
            and any(
                isinstance(a.annotation, ast.Name) and a.annotation.id == "Event"
                for a in node.args.args
            )
        }
        for call, event_params in _log_calls(tree):
            calls += 1
            name = _event_of(call, event_params)
            if name is None or (name != "<parameter>" and name not in Event.__members__):
                missing.append(f"{path.relative_to(REPO)}:{call.lineno}")
        for lineno, names_one in _event_arguments_of_helpers(tree, helpers):
            if not names_one:
                missing.append(f"{path.relative_to(REPO)}:{lineno}")
    assert calls > 20, "the scan found the log calls"
    assert missing == [], "log calls without extra={'event': Event.X, ...}"


def test_every_event_is_documented() -> None:
    text = (REPO / "docs" / "operations.md").read_text()
    text = text.split("\n## Logs\n", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `([a-z_]+)` \|", text, re.M))
    assert documented == {e.value for e in Event}
