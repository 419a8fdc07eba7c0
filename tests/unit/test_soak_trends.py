"""The soak's pure parts: the slope, the flatness verdict and the parsers of /proc."""

from __future__ import annotations

import math
import random

import pytest

from bench.soak.trends import (
    lateness_window,
    noise,
    overall,
    render,
    slope,
    trend,
)


def line(a: float, b: float, n: int = 40, step: float = 15.0) -> list[tuple[float, float]]:
    return [(i * step, a + b * i * step) for i in range(n)]


def test_slope_of_a_line_is_exact() -> None:
    assert slope(line(3.0, 0.25)) == pytest.approx(0.25)
    assert slope([(0.0, 1.0)]) == 0.0
    assert slope([(5.0, 1.0), (5.0, 2.0)]) == 0.0  # no spread in time: no slope


def test_noise_is_zero_on_a_line_and_twice_the_spread_around_it() -> None:
    assert noise(line(1.0, 2.0), 2.0) == pytest.approx(0.0, abs=1e-9)
    points = [(float(t), 10.0 + (1 if t % 2 else -1)) for t in range(100)]
    assert noise(points, slope(points)) == pytest.approx(2.0, rel=0.02)


def test_a_table_that_keeps_growing_grows() -> None:
    # 10 MB growing by 2 MB a minute, sampled every 15 s for an hour
    t = trend("table_mb/schedlock_publishes", line(10.0, 2 / 60, 240), warmup_s=900)
    assert t.verdict == "grows"
    assert t.slope_per_hour == pytest.approx(120.0)
    assert t.first == 10.0 and t.last == pytest.approx(10 + 2 / 60 * 239 * 15)
    assert t.gating


def test_a_level_series_with_noise_is_flat() -> None:
    rng = random.Random(7)
    points = [(i * 15.0, 120.0 + rng.gauss(0, 3)) for i in range(240)]
    assert trend("rss_mb/sidecar-0", points, warmup_s=900).verdict == "flat"


def test_a_sawtooth_is_flat_but_a_rising_sawtooth_grows() -> None:
    # dead rows between autovacuums: up by 500 a sample, back to 0 every 20 samples
    saw = [(i * 15.0, float(i % 20) * 500) for i in range(240)]
    assert trend("dead_rows/schedlock_publishes", saw, warmup_s=900).verdict == "flat"
    rising = [(t, v + t * 10) for t, v in saw]  # and 36,000 more an hour
    assert trend("dead_rows/schedlock_publishes", rising, warmup_s=900).verdict == "grows"


def test_the_warmup_is_not_judged() -> None:
    # fills for the first 15 minutes (to the retention), level after
    points = [(i * 15.0, min(i, 60) * 1.0) for i in range(240)]
    assert trend("table_mb/x", points, warmup_s=900).verdict == "flat"
    assert trend("table_mb/x", points, warmup_s=0).verdict == "grows"


def test_small_changes_under_the_floor_are_flat_and_shrinking_is_flat() -> None:
    # one session more over the run is within the floor of one session
    assert trend("sessions/total", line(6.0, 1 / 3600, 240), warmup_s=0).verdict == "flat"
    assert trend("sessions/total", line(6.0, 2 / 3600, 240), warmup_s=0).verdict == "grows"
    assert trend("table_mb/x", line(100.0, -0.01, 240), warmup_s=0).verdict == "flat"


def test_the_relative_tolerance_scales_with_the_level() -> None:
    # 8 % growth of a 1 GB level: within 10 %
    assert trend("table_mb/x", line(1000.0, 80 / 3600, 240), warmup_s=0).verdict == "flat"
    assert trend("table_mb/x", line(1000.0, 130 / 3600, 240), warmup_s=0).verdict == "grows"


def test_too_few_samples_give_no_verdict_and_nan_is_ignored() -> None:
    t = trend("rss_mb/x", [(0.0, 1.0), (10.0, math.nan), (20.0, 2.0)], warmup_s=0)
    assert t.verdict == "too few samples" and t.samples == 3 and t.judged == 2
    assert t.first == 1.0 and t.last == 2.0


def test_the_overall_verdict_counts_gating_series_only() -> None:
    grows_harness = trend("harness_rss_mb/receiver", line(50.0, 1.0), warmup_s=0)
    flat = trend("rss_mb/sidecar-0", line(50.0, 0.0), warmup_s=0)
    assert grows_harness.verdict == "grows" and not grows_harness.gating
    assert overall([grows_harness, flat]) == "flat"
    assert (
        overall([grows_harness, flat, trend("table_mb/x", line(1.0, 1.0), warmup_s=0)]) == "grows"
    )
    assert overall([grows_harness]) == "too few samples"


def test_unknown_kinds_are_refused() -> None:
    with pytest.raises(KeyError):
        trend("bogus/x", line(1.0, 0.0), warmup_s=0)


def test_lateness_window() -> None:
    window = lateness_window([10.0, 20.0, 30.0, 1000.0], 2.0)
    assert window["lateness_ms/p50"] == 25.0
    assert window["lateness_max_ms"] == 1000.0
    assert window["fires_per_s"] == 2.0
    empty = lateness_window([], 2.0)
    assert math.isnan(empty["lateness_ms/p99"]) and empty["fires_per_s"] == 0.0


def test_render_lists_every_series_and_marks_what_does_not_gate() -> None:
    table = render(
        [
            trend("table_mb/x", line(1.0, 1.0), warmup_s=0),
            trend("fires_per_s", line(10.0, 0.0), warmup_s=0),
        ]
    )
    assert "| table_mb/x | MB |" in table and "grows |" in table
    assert "flat (not gating)" in table
