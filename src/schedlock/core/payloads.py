"""What a payload may be, checked the same way by every writer and by every reader.

A payload is a JSON object passed to the app as the ``payload`` field of the delivery's body.
It is bounded where every writer passes (migration 0007's trigger on insert and update — not a
CHECK, which every update would re-check —, the CLI, the operator's webhook and handlers) and
parsed defensively wherever it is read back (the store's row decoding, for both dialects), by
the functions here and nowhere else:

* :data:`MAX_PAYLOAD_BYTES` — 16 KiB of JSON text as the database prints it (``payload::text``
  on PostgreSQL, the stored text on SQLite: ``", "`` and ``": "`` separators, UTF-8).  A
  payload is a reference to the app's own data (an id, a URL), not the data: 16 KiB is far more
  than that needs, small enough that a claim batch of them costs nothing, and it is what the
  cluster path has always refused beyond.
* :data:`MAX_PAYLOAD_DEPTH` — 32 levels of nesting (``{}`` is 1, ``{"a": []}`` 2).  Every JSON
  parser on the way recurses per level: Python's stops at its recursion limit (~1,000, and
  less on a deep stack), .NET's System.Text.Json refuses more than 64 by default and the app's
  body nests the payload one level deeper, Ruby's JSON more than 100.  32 is deeper than any
  payload that is a reference, and leaves every one of them room.

Both bounds are enforced before anything recursive runs: the text's nesting is counted by a
flat scan, and a parsed value is walked with an explicit stack.  Nothing here raises anything
but :class:`PayloadError`, whose message is one line naming the bound.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Final

MAX_PAYLOAD_BYTES: Final = 16 * 1024
MAX_PAYLOAD_DEPTH: Final = 32
# A payload given as text (a file, stdin) may carry whitespace its printed form does not: read
# this much at most before parsing, then measure the parsed value against MAX_PAYLOAD_BYTES.
MAX_PAYLOAD_TEXT: Final = 4 * MAX_PAYLOAD_BYTES
# JSON strings (skipped whole, brackets inside them do not nest) and the brackets that do.
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


class PayloadError(ValueError):
    """The payload is refused; the message says which bound in one line."""


def payload_too_big(size: int) -> PayloadError:
    return PayloadError(
        f"payload is {size} bytes as JSON; at most {MAX_PAYLOAD_BYTES} bytes (16 KiB) are "
        "allowed: pass a reference (an id or URL) instead of the data"
    )


def _too_deep() -> PayloadError:
    return PayloadError(f"payload nests deeper than {MAX_PAYLOAD_DEPTH} levels")


def text_depth(text: str) -> int:
    """The deepest bracket nesting of JSON ``text``, counted without parsing it (strings are
    skipped whole; an unterminated string's brackets count, which only over-estimates)."""
    depth = deepest = 0
    for match in _TOKENS.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif token in "]}":
            depth -= 1
    return deepest


def printed_size(value: Any) -> int:
    """The payload's size in bytes as the database prints it (separators ``", "``, ``": "``).
    Call it on a value of bounded depth only (json.dumps recurses)."""
    text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "), allow_nan=False)
    return len(text.encode("utf-8"))


def _shape_problem(value: Any) -> str | None:
    """Why a parsed value is no payload (None: it is one), walked with an explicit stack."""
    if not isinstance(value, dict):
        return f"payload must be a JSON object, got {_kind(value)}"
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > MAX_PAYLOAD_DEPTH:
                return str(_too_deep())
            children = item.items() if isinstance(item, dict) else enumerate(item)
            for key, child in children:
                if isinstance(key, str) and (problem := _text_problem(key)):
                    return f"payload key {problem}"
                stack.append((child, depth + 1))
        elif isinstance(item, str):
            if problem := _text_problem(item):
                return f"payload string {problem}"
        elif isinstance(item, float):
            if not math.isfinite(item):
                return f"payload holds {item!r}, which JSON cannot carry"
        elif item is not None and not isinstance(item, bool | int):
            return f"payload holds a {_kind(item)}, which JSON cannot carry"
    return None


def _text_problem(text: str) -> str | None:
    # PostgreSQL's jsonb refuses both; SQLite would store what no other reader can take.
    if "\x00" in text:
        return "holds a NUL character (\\u0000), which the database cannot store"
    if _LONE_SURROGATE.search(text):
        return "holds a lone UTF-16 surrogate, which is not a character"
    return None


def _kind(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(
        type(value), "number" if isinstance(value, int | float) else type(value).__name__
    )


def check_payload(value: Any) -> dict[str, Any]:
    """``value`` (already parsed: an admission request's, a handler's, the CLI's) as a payload,
    or PayloadError: an object, at most :data:`MAX_PAYLOAD_DEPTH` deep, of JSON values the
    database can store, at most :data:`MAX_PAYLOAD_BYTES` printed."""
    problem = _shape_problem(value)
    if problem:
        raise PayloadError(problem)
    size = printed_size(value)
    if size > MAX_PAYLOAD_BYTES:
        raise payload_too_big(size)
    return dict(value)


def _refuse_constant(name: str) -> Any:
    raise PayloadError(f"payload holds {name}, which JSON cannot carry")


def parse_payload(text: str | bytes, *, stored: bool = False) -> dict[str, Any]:
    """JSON ``text`` as a payload, or PayloadError; nothing recursive runs on it before its
    depth is known to be within bounds.

    ``stored``: the text is the database's own print of the payload (a row's column), so its
    length is the payload's size and is not measured again.
    """
    if isinstance(text, bytes | bytearray | memoryview):
        raw = bytes(text)
        if len(raw) > (MAX_PAYLOAD_BYTES if stored else MAX_PAYLOAD_TEXT):
            raise payload_too_big(len(raw))
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PayloadError(f"payload is not UTF-8 (byte {exc.start})") from None
    limit = MAX_PAYLOAD_BYTES if stored else MAX_PAYLOAD_TEXT
    if len(text) > limit:  # characters: never more than its bytes, and free to count
        raise payload_too_big(len(text))
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > limit:
        raise payload_too_big(size)
    if text_depth(text) > MAX_PAYLOAD_DEPTH:
        raise _too_deep()
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise PayloadError(f"payload is not JSON: {exc.msg} at position {exc.pos}") from None
    except PayloadError:
        raise
    except (ValueError, RecursionError) as exc:
        # ValueError: an integer of more digits than Python converts (sys.int_info).
        raise PayloadError(f"payload cannot be read: {reason_of(exc)}") from None
    if stored:
        problem = _shape_problem(value)
        if problem:
            raise PayloadError(problem)
        return dict(value)
    return check_payload(value)


def reason_of(exc: BaseException) -> str:
    """A parser's error as a user may read it: its first line up to the advice CPython appends
    for Python programmers (the integer limit's "; use sys.set_int_max_str_digits() …")."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text.split("; use sys.", 1)[0]
