"""The payload rules every writer shares (core/payload): each attack refused with its reason."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedlock.core.payload import (
    MAX_INTEGER_DIGITS,
    MAX_PAYLOAD_BYTES,
    MAX_PAYLOAD_DEPTH,
    MAX_PAYLOAD_TEXT_CHARS,
    PayloadError,
    check_payload,
    json_depth,
    parse_payload,
    serialised_size,
)


def nested(depth: int) -> str:
    """A JSON object ``depth`` deep: {"a":{"a":…{}}}."""
    return '{"a":' * (depth - 1) + "{}" + "}" * (depth - 1)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (nested(900), f"is nested more than {MAX_PAYLOAD_DEPTH} deep"),
        ("[" * 100_000, f"is nested more than {MAX_PAYLOAD_DEPTH} deep"),
        ('{"a": "\\u0000"}', "NUL character (\\u0000), which PostgreSQL's jsonb cannot store"),
        ('{"\\u0000": 1}', "has a key with a NUL character"),
        ('{"a": "\\ud800"}', "lone surrogate"),
        ('{"a": "\\udfff x"}', "lone surrogate"),
        ('{"a": NaN}', "holds NaN, which is not JSON"),
        ('{"a": [-Infinity]}', "holds -Infinity"),
        ('{"a": 1e999}', "beyond the range of a double"),
        ('{"a": ' + "9" * 5000 + "}", f"integer of more than {MAX_INTEGER_DIGITS} digits"),
        ('{"a": -' + "9" * 5000 + "}", f"integer of more than {MAX_INTEGER_DIGITS} digits"),
        ('{"a": "' + "x" * 120_000 + '"}', "bytes serialised; at most 16384 bytes (16 KiB)"),
        (" " * (MAX_PAYLOAD_TEXT_CHARS + 1), "characters of JSON; at most 16384 bytes"),
        ("[1]", "must be a JSON object, got an array"),
        ('"x"', "must be a JSON object, got a string"),
        ("null", "must be a JSON object, got null"),
        ("{", "must be a JSON object: Expecting property name"),
        ('{"a": 1} x', "Extra data at line 1 column 10"),
    ],
)
def test_each_attack_is_refused_with_its_reason(text: str, says: str) -> None:
    with pytest.raises(PayloadError) as refused:
        parse_payload(text)
    assert says in str(refused.value)
    assert len(str(refused.value)) < 200 and "\n" not in str(refused.value)


def test_what_jsonb_stores_is_accepted() -> None:
    text = json.dumps(
        {"emoji": "😀", "pair": "\ud83d\ude00", "big": 10**300, "neg": -1.5e300, "n": None}
    )
    payload = parse_payload(text)
    assert payload["pair"] == "😀" and payload["big"] == 10**300
    assert parse_payload(nested(MAX_PAYLOAD_DEPTH)) == json.loads(nested(MAX_PAYLOAD_DEPTH))
    assert parse_payload('{"a": ' + "9" * MAX_INTEGER_DIGITS + "}")["a"] > 0


def test_the_size_limit_is_the_compact_serialisation() -> None:
    """16 KiB serialised however much whitespace the text has (a pretty-printed file)."""
    just_fits = {"a": "x" * (MAX_PAYLOAD_BYTES - len('{"a":""}'))}
    assert serialised_size(just_fits) == MAX_PAYLOAD_BYTES
    assert parse_payload(json.dumps(just_fits, indent=8)) == just_fits
    with pytest.raises(PayloadError, match="is 16385 bytes serialised"):
        check_payload({"a": just_fits["a"] + "x"})
    # UTF-8 bytes, not characters: 'é' is two
    with pytest.raises(PayloadError, match="bytes serialised"):
        check_payload({"a": "é" * (MAX_PAYLOAD_BYTES // 2)})


def test_decoded_values_are_walked_without_recursion() -> None:
    """A value nested a million deep (from YAML, a driver) is refused, not a RecursionError."""
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(1_000_000):
        node["a"] = {}
        node = node["a"]
    with pytest.raises(PayloadError, match="nested more than 32 deep"):
        check_payload(deep)
    with pytest.raises(PayloadError, match="key that is a number"):
        check_payload({1: "x"})
    with pytest.raises(PayloadError, match="not finite"):
        check_payload({"a": float("nan")})
    with pytest.raises(PayloadError, match="integer of more than"):
        check_payload({"a": [10**MAX_INTEGER_DIGITS]})
    with pytest.raises(PayloadError, match="holds a bytes"):
        check_payload({"a": b"x"})
    assert check_payload({"a": [10**MAX_INTEGER_DIGITS - 1, True, None, 1.5]})


def test_json_depth_skips_brackets_in_strings() -> None:
    assert json_depth('{"a": "[[[{{{\\"[[["}') == 1
    assert json_depth("[[1], [[2]]]") == 3
    assert json_depth("[" * 10_000, stop_above=5) == 6


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200) | JSON.map(json.dumps))
def test_no_text_escapes_as_anything_but_a_payload_error(text: str) -> None:
    """Any text: a payload or PayloadError, and an accepted one is what jsonb stores."""
    try:
        payload = parse_payload(text)
    except PayloadError as exc:
        error = str(exc)
    else:
        error = None
    if error is not None:
        assert "\n" not in error
        return
    encoded = json.dumps(payload, ensure_ascii=False, allow_nan=False).encode()
    assert b"\\u0000" not in encoded and len(encoded) <= MAX_PAYLOAD_BYTES


@settings(max_examples=200, deadline=None)
@given(JSON)
def test_check_and_parse_agree(value: Any) -> None:
    """A decoded value and its JSON text get the same answer (the two writers' paths)."""
    try:
        checked = check_payload(value)
    except PayloadError:
        checked = None
    try:
        text = json.dumps(value)
    except ValueError:  # only an int beyond CPython's digits, which check_payload refused
        assert checked is None
        return
    try:
        parsed = parse_payload(text)
    except PayloadError:
        parsed = None
    assert (checked is None) == (parsed is None), (value, text)
