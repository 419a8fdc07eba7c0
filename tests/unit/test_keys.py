"""The advisory lock id derivation is part of the database contract: it must never drift."""

from __future__ import annotations

import hashlib

import pytest

from schedlock.store.keys import SCHEDLOCK_CLASS_ID, LockKey, objid_for


def test_class_id_spells_sclk_and_fits_int4() -> None:
    assert SCHEDLOCK_CLASS_ID.to_bytes(4, "big") == b"SCLK"
    assert -(2**31) <= SCHEDLOCK_CLASS_ID < 2**31


def test_objid_is_the_documented_hash() -> None:
    key = LockKey("publish", "default", "demo")
    assert key.text == "schedlock/v1/publish/default/demo"
    digest = hashlib.sha256(b"schedlock/v1/publish/default/demo").digest()
    assert key.objid == int.from_bytes(digest[:4], "big", signed=True)
    # Frozen value: changing the derivation would split leadership during a rolling upgrade.
    assert key.objid == objid_for("schedlock/v1/publish/default/demo") == 453857010
    assert LockKey("publish", "default", "demo").objid == key.objid


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (("publish", "default", "demo"), ("recurring", "default", "demo")),
        (("publish", "a", "bc"), ("publish", "ab", "c")),  # the separator keeps these apart
        (("publish", "default", "demo"), ("publish", "default", "demo2")),
    ],
)
def test_distinct_keys_get_distinct_ids(a: tuple[str, str, str], b: tuple[str, str, str]) -> None:
    assert LockKey(*a).objid != LockKey(*b).objid


def test_ids_fit_int4_for_many_keys() -> None:
    for i in range(2000):
        objid = LockKey("publish", f"ns-{i}", f"app-{i}").objid
        assert -(2**31) <= objid < 2**31
