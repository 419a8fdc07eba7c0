"""The settings' field parsers (core/settings) and the settings objects built from them.

Properties: whatever text a flag or variable holds, building settings gives either settings or
one SettingError of one line (the CLI prints it, exit status 2); an accepted URL is one the
process can use as it is. Plus each attack of issue 21 with the line it now gives.
"""

from __future__ import annotations

import math
from typing import Any
from urllib.parse import urlsplit

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedlock.core.settings import (
    SettingError,
    build,
    check_url,
    http_url,
    integer,
    number,
    quoted,
    schema_name,
    specs,
    text,
)
from schedlock.operator.settings import OperatorSettings
from schedlock.sidecar.settings import SidecarSettings

REQUIRED = {"SCHEDLOCK_DATABASE_URL": "postgresql://u@127.0.0.1:9/db", "SCHEDLOCK_TARGET": "demo"}


def outcome(parse: Any, raw: str) -> tuple[Any, str | None]:
    """(value, None) or (None, the ValueError's text): nothing else may come out."""
    try:
        return parse(raw), None
    except ValueError as exc:
        return None, str(exc)


def refusal(cls: type[Any], env: str, value: str) -> str:
    with pytest.raises(SettingError) as error:
        build(cls, None, environ={**REQUIRED, env: value})
    message = str(error.value)
    assert "\n" not in message and len(message) < 400, message
    return message


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("http://127.0.0.1:99999/hook", "port from 1 to 65535, got 'http://127.0.0.1:99999/hook'"),
        ("http://127.0.0.1:abc/hook", "a port from 1 to 65535"),
        ("http://127.0.0.1:0/hook", "a port from 1 to 65535"),
        ("abc", "must be an http:// or https:// URL of at most 2048 characters with a host"),
        ("http://[::1/hook", "with a host"),  # urlsplit's own ValueError
        ("http:///hook", "with a host"),
        ("http://exa\tmple.com/", "got 'http://exa\\tmple.com/'"),  # urlsplit drops the tab
        ("http://a b/", "with a host"),
        ("http://h/" + "x" * 100_000, "(100009 characters)"),
    ],
)
def test_bad_target_url_is_one_line(value: str, says: str) -> None:
    line = refusal(SidecarSettings, "SCHEDLOCK_TARGET_URL", value)
    assert line.startswith("--target-url / SCHEDLOCK_TARGET_URL: must be an http:// or https://")
    assert says in line


@pytest.mark.parametrize(
    ("env", "value", "says"),
    [
        ("SCHEDLOCK_TARGET_READY_URL", "http://h:70000/", "a port from 1 to 65535"),
        ("SCHEDLOCK_TARGET_READY_URL", "tcp://h:0", "a port from 1 to 65535"),
        ("SCHEDLOCK_BATCH_SIZE", "9" * 5000, "from 1 to 10000, got '9999"),
        ("SCHEDLOCK_BATCH_SIZE", "1_0", "a whole number from 1 to 10000, got '1_0'"),
        ("SCHEDLOCK_BATCH_SIZE", "١٠", "a whole number"),
        ("SCHEDLOCK_POLL_SECONDS", "1e999", "from 0.1 to 3600, got '1e999'"),
        ("SCHEDLOCK_POLL_SECONDS", "9" * 5000, "(5000 characters)"),
        ("SCHEDLOCK_HOLDER", "pod\x1b[31m", "got 'pod\\x1b[31m'"),
        ("SCHEDLOCK_HOLDER", "pod\u200b", "printable"),  # zero-width space
        ("SCHEDLOCK_SIGNING_SECRET_FILE", "/tmp/a\x00b", "readable file"),
        ("SCHEDLOCK_SIGNING_SECRET_FILE", "/" + "d" * 5000, "cannot be read: File name too long"),
        ("SCHEDLOCK_SIGNING_SECRET_FILE", "/tmp", "cannot be read: Is a directory"),
    ],
)
def test_bad_sidecar_setting_is_one_line(env: str, value: str, says: str) -> None:
    assert says in refusal(SidecarSettings, env, value)


def test_nested_resources_are_one_line() -> None:
    """The operator's JSON setting: json.loads' RecursionError is caught at the boundary."""
    line = refusal(OperatorSettings, "SCHEDLOCK_SIDECAR_RESOURCES", "[" * 100_000)
    assert line == (
        "--sidecar-resources / SCHEDLOCK_SIDECAR_RESOURCES: is nested too deep to be read"
    )


def test_urls_that_are_accepted() -> None:
    for raw in ("http://127.0.0.1:8080/schedlock", "https://app.ns.svc/hook?x=1", "http://[::1]/"):
        assert http_url(raw) == raw
    assert http_url("http://h:65535/") and check_url("tcp://h:1")


# -- properties -----------------------------------------------------------------------------------

URL_TEXT = st.text() | st.builds(
    lambda scheme, host, port, rest: f"{scheme}://{host}{port}{rest}",
    st.sampled_from(["http", "https", "tcp", "HTTP", "ftp", ""]),
    st.text(alphabet="ab1.:[]-@%", max_size=12),
    st.one_of(st.just(""), st.integers(-10, 10**6).map(lambda p: f":{p}"), st.text(max_size=6)),
    st.text(max_size=12),
)


@settings(max_examples=500, deadline=None)
@given(URL_TEXT)
def test_an_accepted_target_url_is_usable_as_it_is(raw: str) -> None:
    value, error = outcome(http_url, raw)
    if error is not None:
        assert "\n" not in error
        return
    parts = urlsplit(value)
    assert parts.scheme in ("http", "https") and parts.hostname
    assert parts.port is None or 1 <= parts.port <= 65535  # .port raises on anything else
    assert value.isprintable() and not any(c.isspace() for c in value)


@settings(max_examples=500, deadline=None)
@given(URL_TEXT)
def test_an_accepted_check_url_is_usable_as_it_is(raw: str) -> None:
    value, error = outcome(check_url, raw)
    if error is not None:
        return
    parts = urlsplit(value)
    assert parts.hostname and (parts.port is None or 1 <= parts.port <= 65535)
    if parts.scheme == "tcp":
        assert parts.port is not None


NUMBER_TEXT = (
    st.text(max_size=30)
    | st.integers().map(str)
    | st.floats().map(str)
    | st.from_regex(r"\A[ +-]?[0-9_.eE]{1,12}\Z")
    | st.integers(1, 6000).map(lambda n: "9" * n)
)


@settings(max_examples=400, deadline=None)
@given(NUMBER_TEXT)
def test_numbers_are_in_bounds_or_a_value_error(raw: str) -> None:
    for parse, low, high in ((integer(1, 100), 1, 100), (number(0.05, 60), 0.05, 60)):
        value, error = outcome(parse, raw)
        if error is not None:
            assert "\n" not in error and len(error) < 200
        else:
            assert math.isfinite(value) and low <= value <= high


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_text_is_printable_and_bounded_or_a_value_error(raw: str) -> None:
    value, error = outcome(text(63), raw)
    if error is not None:
        assert "\n" not in error
        return
    assert 1 <= len(value) <= 63 and value.isprintable()


SETTINGS = [
    (cls, spec.env)
    for cls in (SidecarSettings, OperatorSettings)
    for _, spec in specs(cls)
    if spec.env
]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(SETTINGS), st.text(max_size=80) | NUMBER_TEXT | URL_TEXT)
def test_any_value_of_any_setting_builds_or_is_one_setting_error(
    setting: tuple[type[Any], str], value: str
) -> None:
    """Every setting of both services, any text: settings, or SettingError naming it."""
    cls, env = setting
    try:
        build(cls, None, environ={**REQUIRED, env: value})
    except SettingError as exc:
        error = str(exc)
    else:
        return
    assert "\n" not in error and env in error, error
    if env != "SCHEDLOCK_DATABASE_URL":  # its text is the redaction's (helper G's hunk)
        assert len(error) < 600


def test_quoted_escapes_and_cuts() -> None:
    assert quoted("a\nb\x07") == "'a\\nb\\x07'"
    assert quoted("x" * 70) == repr("x" * 64) + "… (70 characters)"


@pytest.mark.parametrize("name", ["schedlock", "jobs_2", "_private", "a" * 63, "public"])
def test_a_schema_name_is_a_plain_lower_case_identifier(name: str) -> None:
    assert schema_name(f" {name} ") == name


@pytest.mark.parametrize(
    "name", ["", "Schedlock", "2jobs", "a" * 64, "pg_catalog", "information_schema", 'x"y', "a b"]
)
def test_a_schema_name_that_needs_quoting_or_is_reserved_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="must be a schema name"):
        schema_name(name)
