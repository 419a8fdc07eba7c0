"""Percentiles and the one summary shape every distribution in the results uses."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between closest ranks."""
    if not values:
        return math.nan
    ordered = sorted(values)
    if len(ordered) == 1:
        return float(ordered[0])
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return float(ordered[low] + (ordered[high] - ordered[low]) * (rank - low))


def _round(value: float, digits: int) -> float | None:
    return None if math.isnan(value) else round(value, digits)


def summarize(values: Sequence[float], *, censored: int = 0, digits: int = 1) -> dict[str, Any]:
    """``{p50, p99, max, n, min, mean, censored}``.

    ``censored`` counts values that are lower bounds (a trial that hit its cap, a row that had
    not arrived when the run ended): the percentiles are then lower bounds too.
    """
    n = len(values)
    return {
        "p50": _round(percentile(values, 50), digits),
        "p99": _round(percentile(values, 99), digits),
        "max": _round(max(values), digits) if values else None,
        "n": n,
        "min": _round(min(values), digits) if values else None,
        "mean": _round(sum(values) / n, digits) if values else None,
        "censored": censored,
    }
