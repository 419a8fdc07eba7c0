"""The soak (``make soak``) runs end to end in 25 s, so it cannot rot: PostgreSQL, three
sidecars, kube-apiserver + etcd and the operator with ScheduledPublish objects, SIGKILLs and
restarts; its outputs are written, every series is sampled and judged, nothing is left running.
Only the shape is checked, never a figure: growth belongs to an hour-long run."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest

from bench.soak.run import SoakConfig, soak
from testbed.procs import children

SERIES = {
    "table_mb/schedlock_publishes",
    "live_rows/schedlock_publishes",
    "dead_rows/schedlock_publishes",
    "table_mb/schedlock_terms",
    "sessions/total",
    "sessions/operator",
    "rss_mb/postgres",
    "rss_mb/sidecar-0",
    "rss_mb/sidecar-1",
    "rss_mb/sidecar-2",
    "rss_mb/operator",
    "harness_rss_mb/receiver",
    "harness_rss_mb/etcd",
    "harness_rss_mb/kube-apiserver",
    "lateness_ms/p50",
    "lateness_ms/p99",
    "fires_per_s",
}


@pytest.mark.timeout(300)
def test_soak_runs_samples_judges_and_cleans_up(tmp_path: Path) -> None:
    before = set(children(os.getpid()))
    out = tmp_path / "out"
    config = SoakConfig(
        duration_s=25,
        interval_s=2,
        kill_every_s=7,
        restart_after_s=2,
        operator="on",
        object_every_s=3,
        object_keep_s=9,
        warmup_fraction=0.2,
    )
    summary = soak(config, out, workdir=tmp_path / "run")

    assert not summary["interrupted"]
    assert summary["operator"] is True
    assert summary["kills"] >= 2 and summary["restarts"] >= 2, summary["events"]
    assert summary["leader_kills"] >= 1, summary["events"]
    assert summary["objects_created"] >= 4 and summary["objects_refused"] == 0
    with (out / "samples.csv").open() as f:
        rows = list(csv.DictReader(f))
    seen = {row["series"] for row in rows}
    assert seen >= SERIES, SERIES - seen
    fires = [float(r["value"]) for r in rows if r["series"] == "fires_per_s"]
    assert sum(fires[len(fires) // 2 :]) > 0, "nothing fired after the kills"
    assert json.loads((out / "summary.json").read_text())["verdict"] == summary["verdict"]
    assert summary["verdict"] in ("flat", "grows")
    trends = {t["series"]: t for t in summary["trends"]}
    assert set(trends) == seen
    for name in ("table_mb/schedlock_publishes", "sessions/total", "rss_mb/postgres"):
        assert trends[name]["verdict"] in ("flat", "grows"), trends[name]
        assert isinstance(trends[name]["slope_per_hour"], float | int)
    assert summary["growing"] == [
        t["series"] for t in summary["trends"] if t["gating"] and t["verdict"] == "grows"
    ]
    assert (out / "soak.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| series |" in (out / "summary.md").read_text()
    left = [pid for pid in set(children(os.getpid())) - before if Path(f"/proc/{pid}").exists()]
    assert not left, f"processes left running: {left}"
