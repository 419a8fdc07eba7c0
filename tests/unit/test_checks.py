"""The test bed's delivery checks fail on what they are meant to catch (testbed.checks)."""

from __future__ import annotations

import pytest

from testbed.checks import assert_duplicates_only_across_crash, assert_one_leader_at_a_time


def delivery(uid: str, term: int, holder: str, arrival: float, key: str = "") -> dict[str, object]:
    return {"uid": uid, "term": term, "holder": holder, "arrival": arrival, "key": key or uid}


def test_one_leader_after_another_passes() -> None:
    assert_one_leader_at_a_time(
        [
            delivery("a", 1, "old-0", 1.0),
            delivery("b", 1, "old-0", 1.1),
            delivery("tick@2026-12-01T09:00:00.000000Z", 4, "new-0", 1.2),  # the other key
            delivery("c", 2, "new-0", 1.3),
        ]
    )


def test_interleaved_terms_of_one_key_fail() -> None:
    with pytest.raises(AssertionError, match="a delivery of term 1 \\(old-0\\) arrived after"):
        assert_one_leader_at_a_time(
            [
                delivery("a", 1, "old-0", 1.0),
                delivery("b", 2, "new-0", 1.1),
                delivery("c", 1, "old-0", 1.2),
            ]
        )


def test_two_holders_of_one_term_fail() -> None:
    with pytest.raises(AssertionError, match="more than one holder"):
        assert_one_leader_at_a_time(
            [delivery("a", 3, "old-0", 1.0), delivery("b", 3, "new-1", 2.0)]
        )


def test_a_second_delivery_needs_a_crash_and_the_same_key() -> None:
    twice = [delivery("a", 1, "old-2", 1.0), delivery("a", 2, "new-0", 2.0)]
    assert_duplicates_only_across_crash(twice, crashed={"old-2"})
    with pytest.raises(AssertionError, match="without a crash"):
        assert_duplicates_only_across_crash(twice, crashed=set())
    with pytest.raises(AssertionError, match="different idempotency keys"):
        assert_duplicates_only_across_crash(
            [twice[0], delivery("a", 2, "new-0", 2.0, key="other")], crashed={"old-2"}
        )
