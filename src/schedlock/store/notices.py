"""Reading NOTIFY payloads: one pure function per channel, total over whatever arrives.

Any role that can connect may ``NOTIFY`` any channel with any text up to PostgreSQL's 8,000
bytes, and a database in ``SQL_ASCII`` hands out bytes no encoding decodes (the store then
passes the raw bytes on).  So a payload is input from a stranger: these functions never raise,
whatever the bytes, the size, the nesting or the numbers (``1e999``, ``NaN``, a 7,000-digit
integer).  A payload that is not one of ours is *garbled*: the caller ignores it and, where a
notification matters, makes up for one it may have lost (the status sync sweeps sooner).

Invariants: an id handed out is a PostgreSQL ``bigint`` above zero (a row id); a key handed
out has three non-empty parts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from schedlock.store.models import ForeignHolder

MAX_PAYLOAD_BYTES = 8000  # PostgreSQL's limit for a NOTIFY payload (bytes, in the server encoding)
BIGINT_MAX = 2**63 - 1
PID_MAX = 2**31 - 1  # a backend pid is a PostgreSQL integer
ROLE_NAME_MAX = 63  # NAMEDATALEN - 1: a longer role name is not one
# The message of the ``lock`` statement's notice when who holds the key's lock changes (its
# detail: a JSON array of {"pid", "role"}, empty once the foreign holder is gone).
FOREIGN_HOLDER_NOTICE = "schedlock_foreign_lock_holder"
# A flood of garbage is said at debug at most once per this many seconds (per listener).
GARBLED_LOG_SECONDS = 60.0


@dataclass(frozen=True)
class OutcomesNotice:
    """What a ``schedlock_outcomes`` payload names: row ids, and whether any of it was garbage."""

    ids: frozenset[int]
    garbled: bool


def _text(payload: str | bytes) -> str | None:
    if isinstance(payload, bytes):
        if len(payload) > MAX_PAYLOAD_BYTES:
            return None
        try:
            return payload.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return payload if len(payload) <= MAX_PAYLOAD_BYTES else None


def _row_id(value: object) -> int | None:
    # bool is an int to Python, and 1.0 / "1" are not what the sidecars send: refused
    if type(value) is int and 0 < value <= BIGINT_MAX:
        return value
    return None


def parse_outcomes(payload: str | bytes) -> OutcomesNotice:
    """The row ids of a ``schedlock_outcomes`` payload (``{"ids": [...], ...}``), never raising.

    Ids that are not integers in bigint range are dropped and mark the notice garbled, as does
    a payload that is not such an object at all.
    """
    text = _text(payload)
    if text is None:
        return OutcomesNotice(frozenset(), garbled=True)
    try:
        # NaN/Infinity/1e999 become floats (refused below), never ints; a 5,000-digit integer
        # is a ValueError (the interpreter's digit limit); 4,000 nested brackets a RecursionError.
        body = json.loads(text)
    except (ValueError, RecursionError):
        return OutcomesNotice(frozenset(), garbled=True)
    ids = body.get("ids") if isinstance(body, dict) else None
    if not isinstance(ids, list):
        return OutcomesNotice(frozenset(), garbled=True)
    found = {_row_id(value) for value in ids}
    good = frozenset(i for i in found if i is not None)
    return OutcomesNotice(good, garbled=None in found)


def parse_rows(payload: str | bytes) -> tuple[str, str, str] | None:
    """The lock key ``(scheduler, namespace, target)`` of a ``schedlock_rows`` payload
    (``scheduler/namespace/target``, migration 0001's triggers), None when it is not one."""
    text = _text(payload)
    if text is None:
        return None
    parts = text.split("/", 2)  # a target may hold a slash; a scheduler or namespace cannot
    if len(parts) != 3 or not all(parts):
        return None
    return parts[0], parts[1], parts[2]


def parse_foreign_holder(detail: str | bytes | None) -> ForeignHolder | None:
    """The foreign holder a ``schedlock_foreign_lock_holder`` notice's detail names (the lowest
    pid when several hold the lock in shared mode), None when it names none or is not one of
    ours; never raising."""
    text = None if detail is None else _text(detail)
    if text is None:
        return None
    try:
        holders = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(holders, list):
        return None
    found = [
        ForeignHolder(pid=h["pid"], role=h["role"])
        for h in holders
        if isinstance(h, dict)
        and type(h.get("pid")) is int
        and 0 < h["pid"] <= PID_MAX
        and isinstance(h.get("role"), str)
        and 0 < len(h["role"]) <= ROLE_NAME_MAX
    ]
    return min(found, key=lambda h: h.pid) if found else None
