"""The benchmark harness runs end to end (``python -m bench run --smoke``), so it cannot rot.

One short trial per scenario with shortened timings, against its own PostgreSQL,
kube-apiserver and (the cluster scenario) one-node cluster, for schedlock, both baselines and
both peers (River, built by hack/tools.sh, and procrastinate).  Only the shape of the results
is checked — never a number: timing belongs in ``make bench`` on a quiet machine, not in a test.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import report

REPO = Path(__file__).resolve().parents[2]
KEYS = ["machine", "when", *report.KEYS]
ALL = report.SYSTEMS
DISTRIBUTIONS = {
    "failover_sigkill_ms": ALL,
    "failover_sigstop_ms": ALL,
    "handover_sigterm_ms": ("schedlock", "river"),
    "lateness_ms": ALL,
    "throughput_fires_per_s": ALL,
    "idle_queries_per_s_per_replica": ALL,
}


def assert_distribution(entry: object, where: str) -> None:
    assert isinstance(entry, dict), where
    for field in ("p50", "p99", "max"):
        assert isinstance(entry.get(field), int | float), f"{where}.{field}: {entry}"
    assert isinstance(entry.get("n"), int) and entry["n"] >= 1, f"{where}.n: {entry}"


@pytest.mark.timeout(720)
def test_bench_smoke_writes_every_key(tmp_path: Path, cluster_free_host: None) -> None:
    out = tmp_path / "results"
    run = subprocess.run(
        [sys.executable, "-m", "bench", "run", "--smoke", "--no-docs", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=700,
        check=False,
    )
    assert run.returncode == 0, f"stdout:\n{run.stdout}\nstderr:\n{run.stderr[-6000:]}"
    document = json.loads((out / "latest.json").read_text())
    assert list(document) == KEYS
    assert document["machine"]["profile"] == "smoke"
    assert isinstance(document["when"], str)
    for key, systems in DISTRIBUTIONS.items():
        assert set(document[key]) == set(systems), key
        for system in systems:
            assert_distribution(document[key][system], f"{key}.{system}")
    for key in ("cr_to_row_ms", "cr_to_published_ms"):
        assert_distribution(document["operator"][key], f"operator.{key}")
    for key in ("failover_sigkill_ms", "failover_sigstop_ms"):
        for peer in report.PEERS:  # the jobs each victim left unfinished, counted per trial
            stuck = document[key][peer]["stuck_rows"]
            assert [isinstance(n, int) for n in stuck] == [True], f"{key}.{peer}: {stuck}"
    for system in ALL:
        assert_distribution(document["footprint"][system]["rss_mb"], f"footprint.{system}")
        assert_distribution(document["footprint"][system]["sessions"], f"footprint.{system}")
        assert_distribution(
            document["footprint"][system]["idle_cpu_percent"], f"footprint.{system}"
        )
    footprint = document["footprint"]["schedlock"]
    assert_distribution(footprint["start_to_ready_s"], "footprint.schedlock.start_to_ready_s")
    for image in ("schedlock", "schedlock-sidecar"):
        sizes = footprint["image_mb"][image]
        assert 0 < sizes["compressed"] < sizes["unpacked"], (image, sizes)
    scale = document["scale"]
    assert isinstance(scale["one_leader_per_key"], bool)
    assert isinstance(scale["connections"], int)
    fleet = document["scale_targets"]
    assert isinstance(fleet["sessions"]["total"]["median"], int | float), fleet
    assert_distribution(fleet["failover_sigkill_ms"], "scale_targets.failover_sigkill_ms")
    assert_distribution(fleet["failover_both_killed_ms"], "scale_targets.failover_both_killed_ms")
    assert isinstance(fleet["sizing"]["sessions_needed"]["1000x3"], int), fleet
    cluster = document["cluster"]
    for key in ("pod_delete_force_gap_ms", "pod_delete_gap_ms", "rolling_update"):
        assert_distribution(cluster[key], f"cluster.{key}")
        assert isinstance(cluster[key]["lost"], int), cluster[key]
    op10k = document["operator_10k"]
    assert_distribution(op10k["burst"]["cr_to_row_ms"], "operator_10k.burst.cr_to_row_ms")
    assert isinstance(op10k["resume"]["api_writes"], int), op10k["resume"]
    assert isinstance(op10k["reassert"]["steady_pass_ms"], float), op10k["reassert"]
    history = document["history"]
    for side in ("empty", "history"):
        assert_distribution(history[side]["lateness_ms"], f"history.{side}.lateness_ms")
        assert history[side]["throughput"]["fires"] >= 1, history[side]
        for key in ("status_cli", "key_status", "sync_first_sweep"):
            assert isinstance(history[side][key]["seconds"], float), history[side][key]
    assert history["load"]["rows"] == history["rows"] and history["load"]["table_mb"] > 0
    assert history["history"]["rows_in_table"] >= history["rows"]
    prune = history["prune"]
    assert prune.get("skipped") or (prune["cleared"] and prune["rows_deleted"] > 0), prune
    tenancy = document["tenancy"]
    for mode in ("owner", "every_namespace", "namespace"):
        assert_distribution(tenancy["modes"][mode]["lateness_ms"], f"tenancy.{mode}.lateness_ms")
        assert tenancy["modes"][mode]["throughput"]["runs"][0]["fires"] >= 1, tenancy["modes"]
    assert isinstance(tenancy["targets"]["met"], bool)
    table = (out / "latest.md").read_text()
    assert "| history target |" in table and "| a role granted one namespace |" in table
    assert "failover SIGKILL" in table and "| schedlock target |" in table
    assert "| river | procrastinate |" in table and "no leader: n/a" in table
    assert run.stdout.count("| failover SIGKILL, ms |") == 1  # the table is printed too
    assert (out / "failover_gaps.png").stat().st_size > 0
    assert (out / "lateness_cdf.png").stat().st_size > 0
