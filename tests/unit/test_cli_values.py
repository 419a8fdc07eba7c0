"""The CLI's value parsers (publish/schedule): each attack refused in one line, never a traceback.

The parsers run in-process through ``flag_value``, the boundary every flag passes, so the only
error that may come out is a SettingError (the CLI prints it as one line, exit status 2).
"""

from __future__ import annotations

import io
import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedlock.cli import main
from schedlock.cli.admin import MAX_AT_YEARS, _schedule, parse_name, parse_time, read_payload
from schedlock.core.payloads import MAX_PAYLOAD_BYTES, MAX_PAYLOAD_TEXT
from schedlock.core.settings import SettingError, flag_value, one_line
from schedlock.operator import command as operator_command

NOW = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
YEARS = timedelta(days=365.25 * MAX_AT_YEARS)


def outcome(flag: str, raw: str, parse: Any) -> tuple[Any, str | None]:
    """(value, None) or (None, the one-line SettingError): nothing else may come out."""
    try:
        return flag_value(flag, raw, parse), None
    except SettingError as exc:
        error = str(exc)
    assert "\n" not in error, error
    return None, error


def refused(flag: str, raw: str, parse: Any) -> str:
    """The one line a bad value gives (as main prints it, after ``schedlock CMD: error: ``)."""
    with pytest.raises(SettingError) as error:
        flag_value(flag, raw, parse)
    message = str(error.value)
    assert message == one_line(message) and len(message) < 300, message
    return message


# -- --at -----------------------------------------------------------------------------------------


def at(raw: str) -> datetime:
    return parse_time(raw, NOW)


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ("+99999999999h", f"--at: must be at most {MAX_AT_YEARS} years from now, got '+9999"),
        ("+" + "9" * 400 + "s", f"at most {MAX_AT_YEARS} years from now"),
        ("in 877000h", f"at most {MAX_AT_YEARS} years from now"),
        ("9999-12-31T23:59:59-23:59", f"--at: must be within {MAX_AT_YEARS} years of now"),
        ("0001-01-01T00:00:00+01:00", f"within {MAX_AT_YEARS} years of now"),
        ("2200-01-01T00:00:00Z", f"within {MAX_AT_YEARS} years of now"),
        ("1900-01-01T00:00:00Z", f"within {MAX_AT_YEARS} years of now"),
        ("tomorrow", "must be an RFC 3339 time like 2026-12-01T09:00:00Z"),
        ("+١٢s", "must be an RFC 3339 time"),  # non-ASCII digits are not a duration
        ("2026-12-01T09:00:00", "needs a UTC offset or Z (e.g. 2026-12-01T09:00:00Z)"),
        ("+5s\x1b[2J", "got '+5s\\x1b[2J'"),  # escaped, so no terminal control reaches stderr
        ("x" * 100_000, "(100000 characters)"),
    ],
)
def test_bad_at_is_one_line(raw: str, says: str) -> None:
    assert says in refused("--at", raw, at)


def test_good_at() -> None:
    assert at("now") == NOW and at("+30s") == NOW + timedelta(seconds=30)
    assert at("in 5m") == NOW + timedelta(minutes=5) and at("+1.5h") == NOW + timedelta(hours=1.5)
    assert at("2026-12-01T10:00:00+01:00") == NOW
    assert at("2126-11-30T00:00:00Z").year == 2126  # inside the bound, just
    assert at(f"+{int(YEARS.total_seconds())}s") == NOW + YEARS


AT_TEXT = (
    st.text()
    | st.from_regex(r"\A(\+|in\s+)[0-9]{1,25}(\.[0-9]{1,12})?\s*(ms|s|m|h)\Z")
    | st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)).map(
        lambda d: d.isoformat() + "Z"
    )
    | st.builds(
        lambda d, h: f"{d.isoformat()}{h:+03d}:00",
        st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)),
        st.integers(-23, 23),
    )
)


@settings(max_examples=200, deadline=None)
@given(AT_TEXT)
def test_any_at_is_a_time_within_the_bound_or_one_line(raw: str) -> None:
    due, error = outcome("--at", raw, at)
    if error is None:
        assert due.tzinfo is not None and abs(due - NOW) <= YEARS


# -- --payload ------------------------------------------------------------------------------------


def payload(raw: str, stdin: bytes = b"") -> Any:
    return read_payload(raw, io.BytesIO(stdin))


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ('{"a":' * 900 + "{}" + "}" * 900, "--payload: payload nests deeper than 32 levels"),
        ('{"a": "\\u0000"}', "--payload: payload string holds a NUL character (\\u0000)"),
        ('{"a": NaN}', "--payload: payload holds NaN, which JSON cannot carry"),
        ('{"a": "\\ud83d"}', "--payload: payload string holds a lone UTF-16 surrogate"),
        (
            '{"a": ' + "1" * 5000 + "}",
            "--payload: payload cannot be read: Exceeds the limit (4300 digits)",
        ),
        (
            '{"a": "' + "x" * 120_000 + '"}',
            "--payload: payload is 120009 bytes as JSON; at most 16384",
        ),
        ("[1]", "--payload: payload must be a JSON object, got array"),
        ("@/no/such/file.json", "--payload: cannot read the payload file '/no/such/file.json': No"),
        ("@", "--payload: cannot read the payload file ''"),
        ("@/tmp", "Is a directory"),
        ("@bad\x00name", "cannot read the payload file 'bad\\x00name': bad name"),
    ],
)
def test_bad_payload_is_one_line(raw: str, says: str) -> None:
    assert says in refused("--payload", raw, payload)


def test_payload_from_a_file_and_from_stdin(tmp_path: Path) -> None:
    """The way to give a payload too long for argv: @FILE and -, under the same 16 KiB."""
    big = {"text": "y" * (MAX_PAYLOAD_BYTES - 20)}
    file = tmp_path / "payload.json"
    file.write_text(json.dumps(big, indent=4))
    assert payload(f"@{file}") == big
    assert payload("-", json.dumps(big).encode()) == big
    assert payload("-", b'\xef\xbb\xbf{"bom": 1}') == {"bom": 1}  # an editor's byte-order mark
    assert payload('{"literal": "@not-a-file"}') == {"literal": "@not-a-file"}
    file.write_text(json.dumps({"text": "y" * MAX_PAYLOAD_BYTES}))
    assert "--payload: payload is 16396 bytes as JSON" in refused("--payload", f"@{file}", payload)
    one_mb = b'{"a": "' + b"z" * 1_000_000 + b'"}'
    assert f"standard input holds more than {MAX_PAYLOAD_TEXT} bytes" in refused(
        "--payload", "-", lambda r: payload(r, one_mb)
    )
    file.write_bytes(b'{"a": "\xff"}')
    assert f"--payload: {str(file)!r} is not UTF-8 text (byte 7)" in refused(
        "--payload", f"@{file}", payload
    )


def test_payload_input_is_read_bounded() -> None:
    """An endless file (/dev/zero) or stream ends with one line, not with memory."""
    line = refused("--payload", "@/dev/zero", payload)
    assert f"holds more than {MAX_PAYLOAD_TEXT} bytes" in line
    endless = b" " * (MAX_PAYLOAD_TEXT + 10)
    assert "standard input holds more than" in refused(
        "--payload", "-", lambda r: payload(r, endless)
    )


PAYLOAD_TEXT = (
    st.text()
    | st.builds(lambda n: '{"a":' * n + "1" + "}" * n, st.integers(0, 3000))
    | st.builds(lambda n: "[" * n, st.integers(0, 3000))
    | st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
        max_leaves=20,
    ).map(lambda v: json.dumps({"v": v}))
)


@settings(max_examples=300, deadline=None)
@given(PAYLOAD_TEXT)
def test_any_payload_is_an_object_or_one_line(raw: str) -> None:
    value, error = outcome("--payload", raw, payload)
    if error is None:
        assert isinstance(value, dict)
        json.dumps(value, allow_nan=False).encode()  # what the store writes: never raises


# -- --name ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ("n" * 100_000, "--name: must be 1 to 253 printable characters, got 'nnnn"),
        ("evil\x1b]0;pwned\x07", "got 'evil\\x1b]0;pwned\\x07'"),
        ("line\nbreak", "got 'line\\nbreak'"),
        ("rtl\u202eexe.txt", "got 'rtl\\u202eexe.txt'"),  # a bidi override is not printable
        ("bad\udcffbyte", "printable characters"),  # an undecodable argv byte
        ("   ", "must be 1 to 253"),
    ],
)
def test_bad_name_is_one_line(raw: str, says: str) -> None:
    assert says in refused("--name", raw, parse_name)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_any_name_is_printable_and_short_or_one_line(raw: str) -> None:
    name, error = outcome("--name", raw, parse_name)
    if error is None:
        assert 1 <= len(name) <= 253 and name.isprintable()


@settings(max_examples=200, deadline=None)
@given(
    st.text(max_size=200),
    st.sampled_from(["UTC", "Europe/Berlin", "", "../etc/x", "Mars/X", "x" * 1000]) | st.text(),
)
def test_any_cron_or_time_zone_is_a_schedule_or_one_line(cron: str, zone: str) -> None:
    _, error = outcome("--cron/--time-zone", cron, lambda c: _schedule(c, zone))
    assert error is None or len(error) < 400


# -- the commands in-process: exit 2 and one line, before any database is opened ----------------


@pytest.fixture
def database_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    db = tmp_path / "never-opened.db"
    monkeypatch.setenv("SCHEDLOCK_DATABASE_URL", f"sqlite:///{db}")
    return db


@pytest.mark.parametrize(
    "extra",
    [
        ["--at", "+99999999999h"],
        ["--at", "now", "--payload", '{"a":' * 900 + "1" + "}" * 900],
        ["--at", "now", "--payload", '{"a": "\\u0000"}'],
        ["--at", "now", "--name", "x" * 100_000],
        ["--at", "now", "--payload", "@/no/such/file"],
        ["--at", "now", "--max-attempts", "9" * 5000],
    ],
)
def test_publish_refuses_before_touching_the_database(
    extra: list[str], database_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["publish", "--target", "billing", *extra]) == 2
    err = capsys.readouterr().err
    assert re.fullmatch(r"schedlock publish: error: --[a-z-]+: [^\n]+\n", err), err
    assert len(err) < 300 and not database_env.exists()


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    flag=st.sampled_from(["--at", "--payload", "--name", "--namespace", "--deadline-seconds"]),
    value=st.text(min_size=1, max_size=100).filter(lambda t: not t.startswith("-")),
)
def test_any_publish_value_is_exit_0_1_or_2_in_one_line(
    flag: str, value: str, database_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Whatever one flag holds: no exception leaves main, stderr is at most one line."""
    args = {"--at": "now", "--target": "billing", flag: value}
    code = main(["publish", *[part for pair in args.items() for part in pair]])
    err = capsys.readouterr().err
    assert code in (0, 1, 2) and err.count("\n") <= 1, err
    if code == 2:
        assert err.startswith(f"schedlock publish: error: {flag}: ")
    database_env.unlink(missing_ok=True)  # each example starts without a database


def test_status_names_a_foreign_lock_holder_in_printable_words() -> None:
    from schedlock.cli.admin import render_table, squatting_lines, status_rows
    from schedlock.store import KeyStatus

    def key(target: str, role: str | None, pid: int | None) -> KeyStatus:
        return KeyStatus(
            "publish", "team-b", target, 3, "b-0", "b-sidecar-0", 1, None, None, None, 0, None,
            None, foreign_holder_role=role, foreign_holder_pid=pid,
        )  # fmt: skip

    rows = status_rows([key("demo", "tenant_a\x1b[2J\n", 812), key("other", None, None)])
    assert rows[0]["foreignHolder"] == {"role": "tenant_a\x1b[2J\n", "pid": 812}
    assert rows[1]["foreignHolder"] is None
    table = render_table(rows)
    assert "\x1b" not in table and len(table.splitlines()) == 3
    assert "FOREIGN:tenant_a" in table.splitlines()[1] and "(pid 812)" in table
    assert "b-sidecar-0" in table.splitlines()[2]
    (line,) = squatting_lines(rows)
    assert line.startswith("publish/team-b/demo: lock held by role 'tenant_a")
    assert "\x1b" not in line and "\n" not in line
    assert "SELECT pg_terminate_backend(812)" in line


def test_the_operator_without_its_extra_refuses_before_reading_a_setting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The sidecar image has no kopf: `schedlock operator` there says what to install, in one
    line with exit status 2, even when its settings are wrong too (no database URL here)."""
    monkeypatch.setattr(operator_command, "OPERATOR_EXTRA", ("kopf", "no_such_package_here"))
    monkeypatch.delenv("SCHEDLOCK_DATABASE_URL", raising=False)
    assert main(["operator", "--database-url", ""]) == 2
    err = capsys.readouterr().err
    assert err == (
        "schedlock operator: error: the operator needs no_such_package_here, which this "
        "installation lacks: pip install 'schedlock[operator]' (the schedlock image has them, "
        "the schedlock-sidecar image does not)\n"
    )
