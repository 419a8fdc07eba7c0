"""The one payload check (``schedlock.core.payloads``): every bound in one line, and no input,
however deep, big or broken, raises anything but PayloadError."""

from __future__ import annotations

import json
import re
from importlib import resources

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedlock.core.payloads import (
    MAX_PAYLOAD_BYTES,
    MAX_PAYLOAD_DEPTH,
    PayloadError,
    check_payload,
    parse_payload,
    printed_size,
    text_depth,
)


def nested(depth: int) -> str:
    """An object ``depth`` levels deep: {"a": {"a": ... {} }}."""
    return '{"a": ' * (depth - 1) + "{}" + "}" * (depth - 1)


def test_depth_at_the_bound_is_a_payload_and_one_more_is_refused() -> None:
    assert text_depth(nested(MAX_PAYLOAD_DEPTH)) == MAX_PAYLOAD_DEPTH
    assert parse_payload(nested(MAX_PAYLOAD_DEPTH))
    with pytest.raises(PayloadError) as refused:
        parse_payload(nested(MAX_PAYLOAD_DEPTH + 1))
    assert str(refused.value) == "payload nests deeper than 32 levels"


@pytest.mark.parametrize("depth", [900, 3_000, 100_000])
def test_deep_text_is_refused_before_anything_recurses(depth: int) -> None:
    # The 2,000-deep row crashed the leader with RecursionError in psycopg's json.loads.
    # Whichever bound it meets first (the stored text's size is checked before its depth).
    for text in (nested(depth), "[" * depth + "]" * depth):
        for stored in (False, True):
            with pytest.raises(PayloadError, match=r"nests deeper than 32 levels|at most 16384"):
                parse_payload(text, stored=stored)


def test_a_deep_parsed_value_is_refused_without_recursion() -> None:
    value: dict[str, object] = {}
    for _ in range(5_000):  # deeper than json.dumps could print
        value = {"a": value}
    with pytest.raises(PayloadError, match="nests deeper than 32 levels"):
        check_payload(value)


def test_brackets_inside_strings_do_not_nest() -> None:
    text = json.dumps({"s": "[" * 500 + '\\"{' * 100})
    assert text_depth(text) == 1
    assert parse_payload(text)["s"].startswith("[[[")


def test_size_is_measured_as_the_database_prints_it() -> None:
    value = {"a": [1, 2], "é": "ü"}
    # PostgreSQL: SELECT '{"a":[1,2],"é":"ü"}'::jsonb::text -> {"a": [1, 2], "é": "ü"}
    assert printed_size(value) == len('{"a": [1, 2], "é": "ü"}'.encode())
    at_limit = {"blob": "x" * (MAX_PAYLOAD_BYTES - len('{"blob": ""}'))}
    assert printed_size(at_limit) == MAX_PAYLOAD_BYTES
    assert check_payload(at_limit) == at_limit
    over = {"blob": at_limit["blob"] + "x"}
    with pytest.raises(PayloadError) as refused:
        check_payload(over)
    assert str(refused.value) == (
        "payload is 16385 bytes as JSON; at most 16384 bytes (16 KiB) are allowed: pass a "
        "reference (an id or URL) instead of the data"
    )


def test_a_huge_text_is_refused_unread() -> None:
    with pytest.raises(PayloadError, match=r"payload is 20000001 bytes as JSON; at most 16384"):
        parse_payload("[" + "0," * 9_999_999 + "0]", stored=True)
    with pytest.raises(PayloadError, match=r"at most 16384 bytes"):
        parse_payload(b" " * (5 * MAX_PAYLOAD_BYTES))


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("[1]", "payload must be a JSON object, got array"),
        ('"x"', "payload must be a JSON object, got string"),
        ("null", "payload must be a JSON object, got null"),
        ('{"a": NaN}', "payload holds NaN, which JSON cannot carry"),
        ('{"a": -Infinity}', "payload holds -Infinity, which JSON cannot carry"),
        ('{"a": "\\u0000"}', "payload string holds a NUL character (\\u0000), which the database"),
        ('{"\\ud800": 1}', "payload key holds a lone UTF-16 surrogate, which is not a character"),
        ('{"a": 1', "payload is not JSON: Expecting ',' delimiter at position 7"),
        ('{"a": ' + "9" * 5_000 + "}", "payload cannot be read: Exceeds the limit (4300 digits)"),
    ],
)
def test_each_refusal_is_one_line(text: str, said: str) -> None:
    with pytest.raises(PayloadError) as refused:
        parse_payload(text)
    assert str(refused.value).startswith(said)
    assert "\n" not in str(refused.value)
    assert "sys." not in str(refused.value), "advice for Python programmers, not for users"


def test_non_utf8_bytes_are_refused() -> None:
    with pytest.raises(PayloadError, match=r"payload is not UTF-8 \(byte 6\)"):
        parse_payload(b'{"a": \xff}')


def test_the_migration_bounds_the_same_number() -> None:
    # The database's CHECK and triggers (migration 0007) are SQL: the number is written there,
    # and must be the constant.
    folder = resources.files("schedlock.store").joinpath("migrations")
    for name in ("0007_payload_limit.postgres.sql", "0007_payload_limit.sqlite.sql"):
        text = folder.joinpath(name).read_text()
        numbers = set(re.findall(r"(?:> |at most |over )(\d+)", text))
        assert numbers == {str(MAX_PAYLOAD_BYTES)}, name


JSON_TEXT = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=30,
).map(json.dumps)
JSONISH = st.text(alphabet='[]{}":,\\ aé0-9eE.nultrfasNI\x00\ud800', max_size=300)


@settings(max_examples=300, deadline=None)
@given(st.one_of(JSON_TEXT, JSONISH, st.binary(max_size=200)), st.booleans())
def test_no_text_raises_anything_but_payload_error(text: str | bytes, stored: bool) -> None:
    try:
        value = parse_payload(text, stored=stored)
    except PayloadError as exc:
        refusal = str(exc)
    else:
        refusal = ""
        assert isinstance(value, dict)
        assert text_depth(json.dumps(value)) <= MAX_PAYLOAD_DEPTH
        assert check_payload(value) == value
    assert "\n" not in refusal


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=1, max_value=3_000), st.sampled_from(["[", '{"k": ', '{"k": [']))
def test_any_depth_is_payload_error_or_a_payload(depth: int, opener: str) -> None:
    closer = {"[": "]", '{"k": ': "}", '{"k": [': "]}"}[opener]
    text = '{"k": ' + opener * depth + "1" + closer * depth + "}"
    levels = 1 + depth * (opener.count("[") + opener.count("{"))
    if levels > MAX_PAYLOAD_DEPTH:
        with pytest.raises(PayloadError, match="nests deeper than 32 levels"):
            parse_payload(text)
    else:
        assert parse_payload(text)
