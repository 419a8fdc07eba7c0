"""The history scenario's pure parts: the retention that leaves a backlog, the table, and a
partial run merged over an earlier one."""

from __future__ import annotations

import pytest

from bench import report
from bench.history_rows import RECENT_S, Loaded, key_of


def loaded(rows: int = 5_000_000, span_s: float = 5e7, at: float = 1_000_000_000.0) -> Loaded:
    return Loaded(
        rows=rows, keys=400, schedules=4000, span_s=span_s, insert_s=1.0,
        vacuum_analyze_s=1.0, table_mb=1.0, heap_bytes_per_row=536.0, loaded_at=at,
    )  # fmt: skip


def test_retention_leaving_a_backlog_counts_from_the_oldest_row() -> None:
    history = loaded()
    step = history.span_s / history.rows  # 10 s a row
    # right at the load: the oldest 2 M rows finished more than 3 M steps + RECENT_S ago
    assert history.retention_leaving(2_000_000, history.loaded_at) == pytest.approx(
        3_000_000 * step + RECENT_S
    )
    # an hour later, the same rows are an hour older
    later = history.retention_leaving(2_000_000, history.loaded_at + 3600)
    assert later == pytest.approx(3_000_000 * step + RECENT_S + 3600)
    assert history.retention_leaving(history.rows, history.loaded_at) == pytest.approx(RECENT_S)


def test_key_zero_is_the_first_namespace_and_target() -> None:
    assert key_of(0) == ("hist-ns-0", "app-0")
    assert key_of(21) == ("hist-ns-1", "app-1")


def side(p99: float, status_s: float, *, censored: bool = False) -> dict[str, object]:
    sweep = {"seconds": 0.5, "censored": False, "pages": 2, "rows_read": 600,
             "latest_slot_calls": 3, "kube_gets": 0}  # fmt: skip
    return {
        "lateness_ms": {"p50": p99 / 2, "p99": p99, "n": 1500},
        "throughput": {"fires_per_s": 2000.0},
        "status_cli": {"seconds": status_s, "censored": censored},
        "key_status": {"seconds": 0.01, "censored": False},
        "sync_first_sweep": sweep,
    }


def document(history: dict[str, object]) -> dict[str, object]:
    return {"machine": {}, "when": "2026-12-02T00:00:00+00:00", "history": history}


def history_entry(loaded_side: dict[str, object], prune: dict[str, object]) -> dict[str, object]:
    return {
        "rows": 5_000_000,
        "keys": 400,
        "empty": side(20.0, 0.8),
        "history": loaded_side,
        "ratio": {"lateness_p99": 1.2, "lateness_p50": 1.0},
        "targets": {
            "lateness_p99_ratio_max": 1.5,
            "status_s_max": 2.0,
            "prune_s_max": 600.0,
            "prune_lateness_p99_ms_max": 100.0,
        },
        "prune": prune,
    }


def test_history_table_shows_both_sides_the_ratios_and_the_targets() -> None:
    prune = {"expired_at_start": 2_000_000, "cleared": True, "seconds": 300.0,
             "rows_deleted": 2_000_100, "lateness_ms": {"p50": 9.0, "p99": 40.0, "n": 15000}}  # fmt: skip
    table = report.history_table(document(history_entry(side(24.0, 1.1), prune)))
    assert "| lateness p99 (1500 rows) | 20 ms | 24 ms | 1.20× |" in table
    assert "| lateness p99 with history ≤ 1.5× empty | 1.20× | ✅ |" in table
    assert "| `schedlock status` with history < 2 s | 1.1 s | ✅ |" in table
    assert (
        "| 2,000,000 expired rows cleared within 600 s | 300 s (2,000,100 deleted) | ✅ |" in table
    )
    assert "| … lateness p99 during the prune < 100 ms | 40 ms" in table


def test_a_capped_status_or_an_uncleared_backlog_misses_its_target() -> None:
    prune = {"expired_at_start": 2_000_000, "cleared": False, "seconds": 900.0,
             "rows_deleted": 10, "lateness_ms": {"p50": 9.0, "p99": 400.0, "n": 10}}  # fmt: skip
    table = report.history_table(document(history_entry(side(24.0, 300.0, censored=True), prune)))
    assert "| `schedlock status` with history < 2 s | ≥ 300 s | ❌ |" in table
    assert "cleared within 600 s | ≥ 900 s (10 deleted) | ❌ |" in table
    skipped = report.history_table(
        document(history_entry(side(24.0, 1.0), {"skipped": "no pruner"}))
    )
    assert "| prune backlog | no pruner | – |" in skipped


def test_a_partial_run_replaces_its_keys_only_and_says_when_it_was_measured() -> None:
    previous = {"machine": {"commit": "old"}, "when": "earlier", "lateness_ms": {"x": 1}}
    doc = {"machine": {"commit": "new", "profile": "full"}, "when": "now", "history": {"rows": 5}}
    merged = report.merge_partial(previous, doc, ["history"])
    assert list(merged) == ["machine", "when", *report.KEYS]
    assert merged["machine"] == {"commit": "old"} and merged["when"] == "earlier"
    assert merged["lateness_ms"] == {"x": 1}
    assert merged["history"]["rows"] == 5
    assert merged["history"]["measured"]["commit"] == "new"
    assert merged["history"]["measured"]["when"] == "now"


def test_a_ratio_over_a_capped_measurement_is_a_lower_bound() -> None:
    entry = history_entry(side(24.0, 120.0, censored=True), {"skipped": "no pruner"})
    entry["ratio"] = {"status_cli": 150.0}
    assert "| ≥ 120 s | ≥ 150.00× |" in report.history_table(document(entry))
