"""What a payload may be: one definition for every writer (CLI, webhook, handlers, database).

A payload is a JSON object passed to the app as-is. It is bounded where every writer passes, so
that nothing a row holds can stop the key it belongs to:

* at most :data:`MAX_PAYLOAD_BYTES` serialised (compact JSON, UTF-8): a payload is a reference
  to data (an id, a URL), not the data;
* nested at most :data:`MAX_PAYLOAD_DEPTH` deep, so no recursive decoder on the way (Python's
  ``json``, the CLI's, an app's) runs out of stack on it;
* storable by PostgreSQL's ``jsonb`` and readable back by every Python decoder of the row: no NUL
  character (``\\u0000``) and no lone surrogate in a string or key, no ``NaN``/``Infinity``, no
  number beyond a double, no integer of more digits than CPython converts by default.

Each check raises :class:`PayloadError` (a ``ValueError``) whose message has no subject and no
copy of the input, so a caller says whose payload it is (``--payload: …``, ``spec.payload …``)
and the line stays short whatever the input holds. No check recurses: a payload nested a
million deep is refused as cheaply as one nested 33 deep.
"""

from __future__ import annotations

import json
import math
from typing import Any, Final

MAX_PAYLOAD_BYTES: Final = 16 * 1024
MAX_PAYLOAD_DEPTH: Final = 32
"""The top-level object is depth 1; ``{"a": {"b": [1]}}`` is nested 3 deep."""
MAX_PAYLOAD_TEXT_CHARS: Final = 64 * MAX_PAYLOAD_BYTES
"""Longest JSON text parsed at all: whitespace and ``\\u`` escapes aside, 16 KiB serialised is
never longer, and longer text is refused before it costs any parsing."""
MAX_INTEGER_DIGITS: Final = 4300
"""CPython's default ``sys.get_int_max_str_digits()``: the sidecar's decoder refuses more."""

_INTEGER_LIMIT: Final = 10**MAX_INTEGER_DIGITS  # the smallest integer of one digit more
_TOO_BIG = (
    f"at most {MAX_PAYLOAD_BYTES} bytes ({MAX_PAYLOAD_BYTES // 1024} KiB) are allowed: "
    "pass a reference (an id or URL) instead of the data"
)


class PayloadError(ValueError):
    """A payload that no writer may store; the message says why (no subject, no input)."""


def serialised_size(payload: dict[str, Any]) -> int:
    """Bytes of the compact UTF-8 JSON of a payload already checked by :func:`check_payload`."""
    return len(json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode())


def check_payload(value: Any) -> dict[str, Any]:
    """``value`` if it is a payload every writer may store; PayloadError otherwise.

    For values already decoded (a Kubernetes object's ``spec.payload``, a row's column).
    """
    if not isinstance(value, dict):
        raise PayloadError(f"must be a JSON object, got {kind_of(value)}")
    _check_tree(value)
    size = serialised_size(value)
    if size > MAX_PAYLOAD_BYTES:
        raise PayloadError(f"is {size} bytes serialised; {_TOO_BIG}")
    return value


def parse_payload(text: str) -> dict[str, Any]:
    """Parse JSON text into a payload (:func:`check_payload`'s rules); PayloadError otherwise."""
    if len(text) > MAX_PAYLOAD_TEXT_CHARS:
        raise PayloadError(f"is {len(text)} characters of JSON; {_TOO_BIG}")
    depth = json_depth(text)
    if depth > MAX_PAYLOAD_DEPTH:
        raise PayloadError(
            f"is nested more than {MAX_PAYLOAD_DEPTH} deep; at most {MAX_PAYLOAD_DEPTH} levels "
            "are allowed"
        )
    try:
        value = json.loads(
            text, parse_constant=_refuse_constant, parse_int=_integer, parse_float=_double
        )
    except json.JSONDecodeError as exc:
        raise PayloadError(
            f"must be a JSON object: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except RecursionError:  # json_depth bounds it; kept so no input can ever escape as one
        raise PayloadError(f"is nested too deep; at most {MAX_PAYLOAD_DEPTH} levels") from None
    return check_payload(value)


def json_depth(text: str, stop_above: int = MAX_PAYLOAD_DEPTH) -> int:
    """How deep the brackets of JSON text nest (strings skipped), without parsing it.

    Counting stops once it passes ``stop_above``: the answer is then ``stop_above + 1``.
    Unbalanced or invalid text is left to the parser; only the depth is answered here.
    """
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > stop_above:
                    return deepest
        elif char in "]}":
            depth -= 1
    return deepest


def _check_tree(root: dict[str, Any]) -> None:
    """Depth, strings and numbers of a decoded value, walked with a stack (no recursion)."""
    stack: list[tuple[Any, int]] = [(root, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            if depth > MAX_PAYLOAD_DEPTH:
                raise PayloadError(
                    f"is nested more than {MAX_PAYLOAD_DEPTH} deep; at most "
                    f"{MAX_PAYLOAD_DEPTH} levels are allowed"
                )
            if isinstance(node, dict):
                for key, item in node.items():
                    if not isinstance(key, str):
                        raise PayloadError(f"has a key that is {kind_of(key)}, not a string")
                    _check_string(key, "a key")
                    stack.append((item, depth + 1))
            else:
                stack.extend((item, depth + 1) for item in node)
        elif isinstance(node, str):
            _check_string(node, "a string")
        elif isinstance(node, bool) or node is None:
            continue
        elif isinstance(node, int):
            _check_integer_size(node)
        elif isinstance(node, float):
            if not math.isfinite(node):
                raise PayloadError(
                    "holds a number that is not finite (NaN or Infinity): JSON and "
                    "PostgreSQL's jsonb have no such number"
                )
        else:
            raise PayloadError(f"holds {kind_of(node)}, which JSON has no type for")


def _check_string(value: str, what: str) -> None:
    if "\x00" in value:
        raise PayloadError(
            f"has {what} with a NUL character (\\u0000), which PostgreSQL's jsonb cannot store"
        )
    # Surrogates only come as halves here (json decodes a valid pair into one character); the
    # scan is skipped for the usual all-ASCII string.
    if not value.isascii() and any("\ud800" <= c <= "\udfff" for c in value):
        raise PayloadError(
            f"has {what} with a lone surrogate (half of a UTF-16 pair, e.g. \\ud800): not "
            "Unicode text, PostgreSQL's jsonb cannot store it"
        )


def _check_integer_size(value: int) -> None:
    # Compared, not converted: str() of such an integer is what would fail.
    if abs(value) >= _INTEGER_LIMIT:
        raise PayloadError(_integer_message())


def _integer_message() -> str:
    return f"holds an integer of more than {MAX_INTEGER_DIGITS} digits"


def _refuse_constant(name: str) -> Any:
    raise PayloadError(
        f"holds {name}, which is not JSON (PostgreSQL's jsonb refuses NaN and Infinity)"
    )


def _integer(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INTEGER_DIGITS:
        raise PayloadError(_integer_message())
    return int(digits)


def _double(digits: str) -> float:
    value = float(digits)
    if not math.isfinite(value):
        raise PayloadError(
            f"holds the number {digits[:20]}{'…' if len(digits) > 20 else ''}, beyond the range "
            "of a double (about 1.8e308)"
        )
    return value


def kind_of(value: Any) -> str:
    """A decoded value's JSON type as a message names it: "an object", "a number", "null"…"""
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    for cls, name in names.items():
        if isinstance(value, cls):
            return name
    if isinstance(value, int | float):
        return "a number"
    return f"a {type(value).__name__}"
