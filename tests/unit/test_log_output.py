"""What reaches a log line: no secret of the process, no control character a terminal acts on."""

from __future__ import annotations

import json
import logging
import sys

import pytest

from schedlock.core import logs
from schedlock.core.redact import secrets_of
from schedlock.core.settings import build, secrets_in
from schedlock.sidecar.delivery import error_text
from schedlock.sidecar.settings import SidecarSettings

PASSWORD = "S3cr3t-%zz-🙂"
URL = "postgresql://app:S3cr3t-%25zz-%F0%9F%99%82@db:5432/app"
HOSTILE = "HTTP 500 from app: \x1b[2J\x1b]0;owned\x07\rforged line\n\u202egnp.exe\x9b31m"


def record(msg: str, *args: object, **fields: object) -> logging.LogRecord:
    made = logging.makeLogRecord(
        {"name": "psycopg.pool", "levelname": "WARNING", "levelno": 30, "msg": msg, "args": args}
    )
    for key, value in fields.items():
        setattr(made, key, value)
    return made


def with_exception(msg: str, exc: BaseException) -> logging.LogRecord:
    try:
        raise exc
    except type(exc):
        made = record(msg)
        made.exc_info = sys.exc_info()
    return made


@pytest.mark.parametrize("fmt", [logs.TextFormatter, logs.JsonFormatter])
def test_the_process_secrets_never_reach_a_line(fmt: type[logging.Formatter]) -> None:
    formatter = fmt(secrets=secrets_of(URL))  # type: ignore[call-arg]
    lines = [
        # a library's record quoting the connection string, in each spelling
        formatter.format(record(f"error connecting in 'pool-1': {URL}")),
        formatter.format(record("invalid percent-encoded token: %r", PASSWORD)),
        formatter.format(record("x", error=f"password={PASSWORD}", nested={"url": URL})),
        formatter.format(with_exception("crashed", ValueError(f"bad {PASSWORD} in {URL}"))),
    ]
    for line in lines:
        assert "S3cr3t" not in line, line
        assert "%F0%9F%99%82" not in line, line


def test_text_lines_escape_control_characters() -> None:
    formatter = logs.TextFormatter()
    line = formatter.format(record("delivery failed: %s", HOSTILE, error=HOSTILE, event="x"))
    assert "\n" not in line and "\x1b" not in line and "\x07" not in line and "\r" not in line
    assert "\u202e" not in line and "\x9b" not in line
    assert "HTTP 500 from app: \\x1b[2J\\x1b]0;owned\\x07\\rforged line\\n\\u202egnp.exe" in line
    assert line.endswith("event=x") or "event=x" in line


def test_text_tracebacks_keep_their_lines_and_escape_the_rest() -> None:
    line = logs.TextFormatter().format(with_exception("crashed", ValueError(HOSTILE)))
    first, *trace = line.split("\n")
    assert first.endswith("psycopg.pool: crashed")
    assert trace[0] == "Traceback (most recent call last):"
    assert trace[-1].startswith("ValueError: HTTP 500 from app: \\x1b[2J")
    assert not any(c in line for c in "\x1b\x07\r\u202e\x9b")


def test_json_lines_escape_what_json_leaves_raw_and_still_parse() -> None:
    line = logs.JsonFormatter().format(record(HOSTILE + " \ud800 \u2028", error=HOSTILE))
    assert not any(c in line for c in "\x1b\x07\r\n\u202e\x9b\ud800\u2028")
    line.encode("utf-8")  # a lone surrogate would make the write itself fail
    parsed = json.loads(line)
    assert parsed["msg"] == HOSTILE + " \ud800 \u2028"
    assert parsed["error"] == HOSTILE


def test_a_service_logs_with_its_url_secrets_scrubbed() -> None:
    settings = build(
        SidecarSettings,
        None,
        {
            "SCHEDLOCK_DATABASE_URL": URL,
            "SCHEDLOCK_TARGET": "demo",
            "SCHEDLOCK_TARGET_URL": "http://hook:Tok3nValue@127.0.0.1:8080/fire",
        },
    )
    secrets = secrets_in(settings)
    assert PASSWORD in secrets and "Tok3nValue" in secrets
    line = logs.JsonFormatter(secrets=secrets).format(record(f"{PASSWORD} Tok3nValue"))
    assert "S3cr3t" not in line and "Tok3nValue" not in line


def test_last_error_from_a_hostile_body_is_printable_and_bounded() -> None:
    text = error_text(HOSTILE * 20, 200)
    assert len(text) <= 200 and text.endswith("…")
    assert not any(c in text for c in "\x1b\x07\r\n\u202e\x9b")
    assert text.startswith("HTTP 500 from app: \\x1b[2J\\x1b]0;owned\\x07")
    assert error_text("ClientError: http://u:S3cr3t@127.0.0.1/x", 300) == (
        "ClientError: http://u:***@127.0.0.1/x"
    )
