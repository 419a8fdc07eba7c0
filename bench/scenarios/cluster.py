"""Cluster: failover and rolling update of schedlock in pods, beside the host-process figures.

The same product as the cluster tests (``testbed.incluster``): a real one-node cluster,
the chart installed by helm with the image built from the Dockerfile, a demo app of 3 replicas
whose pods get the sidecar from the webhook, PostgreSQL reached by a Service name.  Rows fall
due every 100 ms while a fault happens; each delivery is forwarded by the app to a recorder on
the host, so the figures are arrival times at the app.

- ``pod_delete_force_gap_ms``: the leader's pod deleted with ``--grace-period=0 --force`` (the
  kubelet kills its containers: the lock session ends with the process).  One value per trial:
  the longest stretch between two consecutive first arrivals, i.e. the time without a leader
  as the app sees it (rows are 100 ms apart, so ~100 ms is no gap at all).
- ``pod_delete_gap_ms``: a plain ``kubectl delete pod`` of the leader: the app gets SIGTERM and
  exits; its sidecar sees its app go and hands over before it is stopped itself.
- ``rolling_update``: ``kubectl rollout restart`` of the app during the stream (apps drain 2 s
  on SIGTERM): the longest gap, the latest row, lost and failed rows.

The host-process equivalents are ``failover_sigkill_ms`` and ``handover_sigterm_ms``.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.context import Context
from bench.stats import summarize
from testbed.cluster import Cluster
from testbed.incluster import (
    Product,
    installed_product,
    stream_rows,
    verdict,
    wait_settled,
)

APP = "bench"
SPACING = 0.1


def _trial(product: Product, delete: tuple[str, ...], rows: int) -> dict[str, Any]:
    """One stream of ROWS rows with the leader's pod deleted 3 s in; the stream's verdict."""
    prefix = f"cl-{uuid.uuid4().hex[:8]}"
    url = product.database.host_url
    uids = stream_rows(url, count=rows, spacing=SPACING, prefix=prefix, target=APP)
    time.sleep(3)
    leader = product.wait_leader("default", APP)
    product.cluster.kubectl("delete", "pod", leader, "-n", "default", "--wait=false", *delete)
    outcomes = wait_settled(url, prefix, len(uids), timeout=120)
    assert product.recorder is not None
    result = verdict(uids, outcomes, product.recorder.deliveries(prefix))
    product.rollout_status(APP, "default")
    product.wait_leader("default", APP)
    return result.as_json()


def _rolling(product: Product, rows: int) -> dict[str, Any]:
    prefix = f"ru-{uuid.uuid4().hex[:8]}"
    url = product.database.host_url
    uids = stream_rows(url, count=rows, spacing=SPACING, prefix=prefix, target=APP)
    time.sleep(1.5)
    product.cluster.kubectl("rollout", "restart", f"deployment/{APP}", "-n", "default")
    product.rollout_status(APP, "default")
    outcomes = wait_settled(url, prefix, len(uids), timeout=180)
    assert product.recorder is not None
    result = verdict(uids, outcomes, product.recorder.deliveries(prefix))
    product.wait_leader("default", APP)
    return result.as_json()


def _summary(trials: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        **summarize([t["gap_ms"] for t in trials]),
        "lost": sum(t["lost"] for t in trials),
        "failed": sum(t["states"].get("failed", 0) for t in trials),
        "duplicates": sum(t["duplicates"] for t in trials),
        "late_max_ms": max((t["late_max_ms"] for t in trials), default=None),
    }


def run(ctx: Context) -> None:
    trials = ctx.profile.cluster_trials
    workdir = Path(tempfile.mkdtemp(prefix="cluster-", dir=ctx.env.workdir))
    cluster = Cluster(workdir / "node")
    began = time.monotonic()
    ctx.say("cluster: starting a one-node cluster")
    cluster.start()
    try:
        start_s = cluster.timings.start.get("first_pod_ready")
        with installed_product(cluster, workdir) as product:
            installed_s = time.monotonic() - began
            product.deploy_app(APP, replicas=3, drain_seconds=2)
            product.wait_leader("default", APP)
            ctx.say(f"cluster: ready in {installed_s:.0f} s; {trials} trials of each fault")
            forced = [
                _trial(product, ("--grace-period=0", "--force"), rows=80) for _ in range(trials)
            ]
            plain = [_trial(product, (), rows=80) for _ in range(trials)]
            rolling = [_rolling(product, rows=300) for _ in range(max(1, trials // 3))]
    finally:
        cluster.stop()
    ctx.results["cluster"] = {
        "pod_delete_force_gap_ms": _summary(forced),
        "pod_delete_gap_ms": _summary(plain),
        "rolling_update": {
            **_summary(rolling),
            "late_p99_ms": max(t["late_p99_ms"] for t in rolling),
        },
        "cluster_start_s": start_s,
        "install_s": round(installed_s, 1),
        "stop_s": cluster.timings.stop,
    }
    ctx.series.setdefault("cluster_gap_ms", {})["pod_delete_force"] = [t["gap_ms"] for t in forced]
    ctx.series["cluster_gap_ms"]["pod_delete"] = [t["gap_ms"] for t in plain]
