"""``soak.png``: every series over time, one panel per kind, the kills as vertical lines."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

PANELS = (
    ("table_mb", "table size (heap + indexes + TOAST), MB", False),
    ("live_rows", "live rows (pg_stat_user_tables)", False),
    ("dead_rows", "dead rows (pg_stat_user_tables)", False),
    ("rss_mb", "RSS, MB (postgres: private memory of all its processes)", False),
    ("lateness_ms", "lateness of the window's fires, ms", True),
    ("sessions", "client sessions (pg_stat_activity)", False),
)


def write(path: Path, samples: list[tuple[float, str, float]], summary: dict[str, Any]) -> bool:
    """Write the plot; False (and a line on stdout) when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no soak.png (pip install -e '.[dev]')")
        return False
    series: dict[str, dict[str, tuple[list[float], list[float]]]] = defaultdict(dict)
    for elapsed, name, value in samples:
        kind, _, what = name.partition("/")
        if kind == "harness_rss_mb":
            kind, what = "rss_mb", f"{what} (harness)"
        elif kind == "lateness_max_ms":
            kind, what = "lateness_ms", "max (not judged: a kill's hand-over)"
        xs, ys = series[kind].setdefault(what or kind, ([], []))
        xs.append(elapsed / 60)
        ys.append(value)
    kills = [e["t"] / 60 for e in summary.get("events", []) if "killed" in e]
    fig, axes = plt.subplots(3, 2, figsize=(13, 11), squeeze=False)
    for ax, (kind, title, log_scale) in zip(axes.flat, PANELS, strict=True):
        for what, (xs, ys) in sorted(series.get(kind, {}).items()):
            style = "--" if what.endswith(")") else "-"
            ax.plot(xs, ys, style, lw=1.2, label=what)
        for x in kills:
            ax.axvline(x, color="red", alpha=0.35, lw=0.8)
        if log_scale:
            ax.set_yscale("log")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("minutes")
        ax.grid(True, alpha=0.3)
        if series.get(kind):
            ax.legend(fontsize=7, ncol=2)
    minutes = summary["config"]["duration_s"] / 60
    fig.suptitle(
        f"schedlock soak, {minutes:.0f} min, started {summary['started']}: verdict "
        f"{summary['verdict']} ({summary['kills']} SIGKILLs, red lines)",
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True
