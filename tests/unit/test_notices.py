"""Notification payloads (``schedlock.store.notices``): whatever arrives, nothing raises."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedlock.store import ForeignHolder
from schedlock.store.notices import (
    BIGINT_MAX,
    MAX_PAYLOAD_BYTES,
    PID_MAX,
    ROLE_NAME_MAX,
    OutcomesNotice,
    parse_foreign_holder,
    parse_outcomes,
    parse_rows,
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=30,
)
payloads = (
    st.binary(max_size=MAX_PAYLOAD_BYTES + 10)
    | st.text(max_size=MAX_PAYLOAD_BYTES + 10)
    | json_values.map(lambda v: json.dumps(v, allow_nan=True))
    | st.lists(json_values).map(lambda ids: json.dumps({"ids": ids}))
)


@settings(max_examples=200, deadline=None)
@given(payloads)
def test_no_payload_raises_and_every_id_is_a_positive_bigint(payload: str | bytes) -> None:
    notice = parse_outcomes(payload)
    assert all(type(i) is int and 0 < i <= BIGINT_MAX for i in notice.ids)
    key = parse_rows(payload)
    assert key is None or all(key)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=BIGINT_MAX), max_size=300))
def test_what_the_sidecars_send_is_read_whole(ids: list[int]) -> None:
    payload = json.dumps({"scheduler": "publish", "namespace": "ns", "term": 3, "ids": ids})
    assert parse_outcomes(payload) == OutcomesNotice(frozenset(ids), garbled=False)
    assert parse_outcomes(payload.encode()) == OutcomesNotice(frozenset(ids), garbled=False)


@pytest.mark.parametrize(
    "payload",
    [
        '{"ids":[1e999]}',  # the attack: OverflowError in int(inf) killed the sync
        '{"ids":[NaN, Infinity, -Infinity]}',
        '{"ids":[' + "9" * 7000 + "]}",  # over the interpreter's integer digit limit
        '{"ids":[9223372036854775808, 0, -1]}',  # outside bigint, or no row id
        '{"ids":[true, 1.0, "1", null, [1], {"id": 1}]}',
        '{"ids": 5}',
        '{"ids": {"1": 1}}',
        "[1, 2]",
        '"ids"',
        "",
        "x" * 7000,
        "[" * 4000 + "]" * 4000,  # deeper than the json module recurses
        b"\xff\xfe{",  # not UTF-8 (a SQL_ASCII database hands out raw bytes)
        b'{"ids":[1]}' + b" " * MAX_PAYLOAD_BYTES,  # more than PostgreSQL can send
    ],
)
def test_garbage_is_garbled_with_no_ids(payload: str | bytes) -> None:
    assert parse_outcomes(payload) == OutcomesNotice(frozenset(), garbled=True)


def test_bad_ids_are_dropped_and_the_good_ones_kept() -> None:
    notice = parse_outcomes('{"ids":[7, 1e999, 9223372036854775807, 9223372036854775808]}')
    assert notice == OutcomesNotice(frozenset({7, BIGINT_MAX}), garbled=True)
    assert parse_outcomes('{"ids":[]}') == OutcomesNotice(frozenset(), garbled=False)


@pytest.mark.parametrize(
    ("payload", "key"),
    [
        ("publish/team-a/web", ("publish", "team-a", "web")),
        (b"recurring/team-a/web", ("recurring", "team-a", "web")),
        ("publish/team-a/web/v2", ("publish", "team-a", "web/v2")),  # a target with a slash
        ("publish/team-a", None),
        ("publish//web", None),
        ("/team-a/web", None),
        ("", None),
        (b"publish/\xff/web", None),
        ("publish/a/" + "x" * MAX_PAYLOAD_BYTES, None),
    ],
)
def test_a_rows_payload_names_a_key_or_nothing(
    payload: str | bytes, key: tuple[str, str, str] | None
) -> None:
    assert parse_rows(payload) == key


holder_details = payloads | st.lists(
    st.fixed_dictionaries(
        {"pid": json_values | st.integers(), "role": json_values | st.text(max_size=80)}
    ),
    max_size=4,
).map(json.dumps)


@settings(max_examples=200, deadline=None)
@given(st.none() | holder_details)
def test_no_foreign_holder_detail_raises_and_a_holder_is_a_pid_and_a_role_name(
    detail: str | bytes | None,
) -> None:
    holder = parse_foreign_holder(detail)
    assert holder is None or (
        type(holder.pid) is int
        and 0 < holder.pid <= PID_MAX
        and isinstance(holder.role, str)
        and 0 < len(holder.role) <= ROLE_NAME_MAX
    )


@pytest.mark.parametrize(
    ("detail", "holder"),
    [
        ('[{"pid": 812, "role": "tenant_a"}]', ForeignHolder(812, "tenant_a")),
        # shared holders: the lowest pid
        ('[{"pid": 9, "role": "b"}, {"pid": 3, "role": "c"}]', ForeignHolder(3, "c")),
        ('[{"pid": 5, "role": "we\\"ird \\n role"}]', ForeignHolder(5, 'we"ird \n role')),
        ("[]", None),  # gone
        ('[{"pid": true, "role": "a"}]', None),
        ('[{"pid": 0, "role": "a"}]', None),
        ('[{"pid": 2147483648, "role": "a"}]', None),
        ('[{"pid": 4, "role": ""}]', None),
        ('[{"pid": 4, "role": "' + "r" * 64 + '"}]', None),
        ('{"pid": 4, "role": "a"}', None),
        ("not json", None),
        (None, None),
    ],
)
def test_a_foreign_holder_detail_is_read_strictly(detail: str | None, holder: object) -> None:
    assert parse_foreign_holder(detail) == holder
