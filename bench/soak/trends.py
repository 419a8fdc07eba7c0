"""Pure parts of the soak: the flatness verdict of a series and the parsers of what it samples.

A series is a list of ``(seconds since the start, value)``.  Its verdict looks only at the
samples after the warm-up (tables fill until the retention window is reached, a fresh process
grows until its caches are warm): a least-squares line through them gives a slope, and the
*growth* is what that line rises over the measured window.  The series is **flat** when that
growth is within the larger of

* the noise: twice the standard deviation of the samples around the line (a sawtooth such as
  dead tuples between two autovacuums rises and falls by design; a trend only counts when it
  stands out of that),
* a relative tolerance of the series' median level (10 %: a 1 % drift over an hour is not a
  leak we could tell from noise in a one-hour run),
* an absolute floor per kind of series (1 MB of table, 5 MB of RSS, one session…), so a series
  near zero does not fail on a unit of change.

A falling series is flat (shrinking is not growth).  Fewer than :data:`MIN_POINTS` samples after
the warm-up give no verdict.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

Point = tuple[float, float]
Verdict = Literal["flat", "grows", "too few samples"]

MIN_POINTS = 4
RELATIVE_TOLERANCE = 0.10


@dataclass(frozen=True)
class Kind:
    """How the series of one kind are judged: the floor of a change worth calling growth, and
    whether a growth fails the soak (``gating``) or is only reported."""

    unit: str
    floor: float
    gating: bool = True


# The prefix of a series name (before the first "/") is its kind.
KINDS: Mapping[str, Kind] = {
    "table_mb": Kind("MB", 1.0),
    "live_rows": Kind("rows", 1000.0),
    "dead_rows": Kind("rows", 1000.0),
    "rss_mb": Kind("MB", 5.0),
    "sessions": Kind("sessions", 1.0),
    "lateness_ms": Kind("ms", 20.0),
    # Reported, never gating: the load's own rate, and the processes of the harness (the
    # recording app keeps a map of every uid it saw; etcd and the API server keep history).
    "fires_per_s": Kind("fires/s", 1.0, gating=False),
    # the worst fire of a window is the one a SIGKILLed leader left for its successor: the
    # lease, by design, whenever a kill falls in the window
    "lateness_max_ms": Kind("ms", 20.0, gating=False),
    "harness_rss_mb": Kind("MB", 5.0, gating=False),
}


def kind_of(series: str) -> Kind:
    return KINDS[series.split("/", 1)[0]]


def slope(points: Sequence[Point]) -> float:
    """Least-squares slope (value per second); 0 for fewer than two distinct times."""
    if len(points) < 2:
        return 0.0
    mean_t = statistics.fmean(t for t, _ in points)
    mean_v = statistics.fmean(v for _, v in points)
    var_t = sum((t - mean_t) ** 2 for t, _ in points)
    if var_t == 0:
        return 0.0
    return sum((t - mean_t) * (v - mean_v) for t, v in points) / var_t


def noise(points: Sequence[Point], fitted_slope: float) -> float:
    """Twice the standard deviation of the samples around their least-squares line."""
    if len(points) < 3:
        return 0.0
    mean_t = statistics.fmean(t for t, _ in points)
    mean_v = statistics.fmean(v for _, v in points)
    residuals = [v - (mean_v + fitted_slope * (t - mean_t)) for t, v in points]
    return 2 * statistics.pstdev(residuals)


@dataclass(frozen=True)
class Trend:
    series: str
    unit: str
    samples: int  # all of them
    judged: int  # after the warm-up
    first: float | None
    last: float | None
    median: float | None  # after the warm-up
    slope_per_hour: float | None  # after the warm-up
    growth: float | None  # what the fitted line rises over the judged window
    allowed: float | None  # the growth it may show and still be flat
    verdict: Verdict
    gating: bool

    def as_json(self) -> dict[str, Any]:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def trend(
    series: str,
    points: Sequence[Point],
    *,
    warmup_s: float,
    relative_tolerance: float = RELATIVE_TOLERANCE,
) -> Trend:
    kind = kind_of(series)
    finite = [(t, v) for t, v in points if math.isfinite(v)]
    judged = [(t, v) for t, v in finite if t >= warmup_s]
    first = finite[0][1] if finite else None
    last = finite[-1][1] if finite else None
    if len(judged) < MIN_POINTS:
        return Trend(
            series, kind.unit, len(points), len(judged), first, last,
            None, None, None, None, "too few samples", kind.gating,
        )  # fmt: skip
    fitted = slope(judged)
    growth = fitted * (judged[-1][0] - judged[0][0])
    median = statistics.median(v for _, v in judged)
    allowed = max(noise(judged, fitted), relative_tolerance * abs(median), kind.floor)
    verdict: Verdict = "flat" if growth <= allowed else "grows"
    return Trend(
        series, kind.unit, len(points), len(judged), first, last,
        median, fitted * 3600, growth, allowed, verdict, kind.gating,
    )  # fmt: skip


def overall(trends: Sequence[Trend]) -> Verdict:
    """``grows`` if any gating series grows; ``too few samples`` if none could be judged."""
    gating = [t for t in trends if t.gating and t.verdict != "too few samples"]
    if not gating:
        return "too few samples"
    return "grows" if any(t.verdict == "grows" for t in gating) else "flat"


def lateness_window(lateness_ms: Sequence[float], seconds: float) -> dict[str, float]:
    """The lateness series' values for one sampling window (p50, p99, max, fires/s); NaN
    percentiles when nothing fired in it."""
    from bench.stats import percentile

    return {
        "lateness_ms/p50": percentile(lateness_ms, 50),
        "lateness_ms/p99": percentile(lateness_ms, 99),
        "lateness_max_ms": max(lateness_ms) if lateness_ms else math.nan,
        "fires_per_s": len(lateness_ms) / seconds if seconds > 0 else math.nan,
    }


def render(trends: Sequence[Trend]) -> str:
    """The figures as a Markdown table: first and last value, slope, growth against what is
    allowed, verdict."""

    def num(value: float | None) -> str:
        if value is None or not math.isfinite(value):
            return "–"
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.2f}"

    lines = [
        "| series | unit | first | last | median | slope /h | growth | allowed | verdict |",
        "|---|---|--:|--:|--:|--:|--:|--:|---|",
    ]
    for t in trends:
        verdict = t.verdict if t.gating else f"{t.verdict} (not gating)"
        lines.append(
            f"| {t.series} | {t.unit} | {num(t.first)} | {num(t.last)} | {num(t.median)} | "
            f"{num(t.slope_per_hour)} | {num(t.growth)} | {num(t.allowed)} | {verdict} |"
        )
    return "\n".join(lines)
