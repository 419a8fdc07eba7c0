"""The scale_targets scenario's pure parts: sessions told apart by target, the sizing rule's
figure, the trials' targets, and the before/after table."""

from __future__ import annotations

from typing import Any

from bench import report
from bench.scenarios.scale_targets import (
    free_slots,
    per_target_counts,
    sessions_needed,
    spread,
    target_name,
    target_of,
)


def test_a_session_belongs_to_the_target_of_its_holder_name() -> None:
    assert target_name(7) == "t07"
    assert target_of("t07-r1") == "t07"
    assert target_of("t07-r12-probe3") == "t07"  # a name derived from the holder's
    for other in ("", "psql", "schedlock-status", "t07", "t07-x1", "app"):
        assert target_of(other) is None, other


def test_sessions_are_counted_per_target_with_the_rest_apart() -> None:
    names = ["t00-r0", "t00-r0", "t00-r1", "t02-r0-probe1", "psql", "t09-r0"]
    counts, other = per_target_counts(names, ["t00", "t01", "t02"])
    assert counts == {"t00": 3, "t01": 0, "t02": 1}
    assert other == 2  # psql, and a target not in the fleet


def test_the_sizing_rule_scales_the_per_target_figure_and_adds_the_operator() -> None:
    # one session per key, 2 keys, leader + 2 standbys: 6 per target
    assert sessions_needed(100, 6) == 606
    assert sessions_needed(1000, 6) == 6006
    # one session per sidecar, leader + 1 standby
    assert sessions_needed(100, 2) == 206
    assert sessions_needed(1000, 2, operator=0) == 2000
    assert sessions_needed(3, 1.5, operator=0) == 4  # a median between samples rounds


def test_trials_spread_over_the_targets() -> None:
    targets = [f"t{i:02d}" for i in range(25)]
    picked = spread(targets, 5)
    assert picked == ["t00", "t05", "t10", "t15", "t20"]
    assert spread(targets[:3], 5) == targets[:3]
    assert spread([], 2) == []


def test_free_slots_leave_out_the_reserved_ones() -> None:
    assert free_slots(150, 3, 141) == 6
    assert free_slots(150, 3, 147) == 0


def result(per_target: float, sessions: int, when: str, commit: str) -> dict[str, Any]:
    dist = {"p50": 20.0, "p99": 30.0, "max": 31.0, "n": 10, "censored": 0}
    return {
        "targets": 50,
        "replicas": 2,
        "max_connections": 150,
        "app_pool": 40,
        "sessions": {
            "total": {"median": sessions, "max": sessions},
            "per_target": {"min": 0, "median": per_target, "max": 4},
            "free_slots": 0,
            "keys": 100,
            "keys_led": 60,
            "targets_with_standby": 20,
        },
        "new_connections_per_s": 1.5,
        "refused_total": 400,
        "refused_in_window": 30,
        "app_can_connect": False,
        "failover_sigkill_ms": {**dist, "with_standby": 8},
        "failover_both_killed_ms": {**dist, "n": 5},
        "sizing": {
            "per_target_at_3_replicas": 6,
            "operator_sessions": 6,
            "sessions_needed": {"100x3": 606, "1000x3": 6006},
        },
        "measured": {"when": when, "commit": commit, "profile": "full"},
    }


def test_the_table_shows_the_stored_before_and_marks_the_after_row_not_measured_yet() -> None:
    before = {"code": "one session per key", **result(2, 106, "2026-12-03T20:00", "aaa")}
    # the latest run is the before measurement itself: no after figures yet
    doc = {"when": "x", "machine": {}, "scale_targets": before}
    table = report.scale_targets_table(doc, before=before)
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    assert len(rows) == 3  # header, before, after
    assert rows[1].startswith("| before: one session per key (aaa, full) | 106 (2 per target")
    assert "606 (6 per target + 6)" in rows[1] and "6,006" in rows[1]
    assert rows[2].startswith("| after | not measured yet")
    assert rows[2].count("|") == rows[0].count("|")
    assert "50 targets × 2 replicas" in table and "max_connections 150" in table


def test_the_table_shows_a_later_run_as_the_after_row() -> None:
    before = {"code": "one session per key", **result(2, 106, "2026-12-03T20:00", "aaa")}
    after = result(2, 100, "2026-12-04T10:00", "bbb")
    table = report.scale_targets_table({"when": "y", "scale_targets": after}, before=before)
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    assert rows[2].startswith("| after (bbb, full) | 100 (2 per target")
    assert "30 / 31" in rows[2] and "8 with a session waiting on its locks" in rows[2]
