"""A real Prometheus scraping three real sidecars, with schedlock's real alert rules.

The rules are those of charts/schedlock/files/prometheus-rules.yaml with every ``for:``
shortened to FOR (same expressions, see ``monitoring.alerts.prometheus_rules``); Prometheus
scrapes every second and evaluates every second. Targets carry ``pod`` and ``namespace``
labels and ``honor_labels: true``, as the chart's PodMonitor does in Kubernetes.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from monitoring import dashboard, generate
from testbed.prometheus import Prometheus, static_scrape_config
from testbed.rows import insert_rows, wait_published
from testbed.sidecars import SidecarGroup, wait_for

FOR = "5s"
FOR_SECONDS = 5.0
SCRAPE = "1s"
# Worst case from the event to "firing": a scrape interval and its timeout (the dead sidecar
# is marked stale), an evaluation to go pending, FOR, an evaluation to fire, our polling.
FIRING_WITHIN = FOR_SECONDS + 1 + 0.8 + 1 + 1 + 2.2
LEASE, HEARTBEAT = 4.0, 1.0
FAST = {
    "SCHEDLOCK_LEASE_SECONDS": str(LEASE),
    "SCHEDLOCK_HEARTBEAT_SECONDS": str(HEARTBEAT),
    # The history panels read what a leader measures at each pruning attempt: one a second,
    # not one a minute, so a new leader has them within the test's wait.
    "SCHEDLOCK_PRUNE_INTERVAL_SECONDS": "1",
}
SLACK = 1.0  # what a hand-over may add to the design's bound on a shared, noisy machine
KEYS = {("publish", "default", "demo"), ("recurring", "default", "demo")}


@pytest.fixture
def group(tmp_path: Path, migrated_database: str) -> Iterator[SidecarGroup]:
    replicas = SidecarGroup(tmp_path / "app", migrated_database, replicas=3, extra_env=FAST)
    try:
        replicas.start()
        yield replicas
    finally:
        replicas.stop()


def start_prometheus(binary: Path, workdir: Path, group: SidecarGroup) -> Prometheus:
    """Prometheus on the group's sidecars with the fast rules, once every sidecar is scraped,
    each key has one leader and no alert is pending: the state every scenario starts in."""
    server = Prometheus(
        binary,
        workdir,
        [static_scrape_config({sidecar.name: sidecar.http_port for sidecar in group})],
        generate.prometheus_rules_yaml(for_override=FOR, interval=SCRAPE),
        scrape_interval=SCRAPE,
    )
    try:
        server.start()
        wait_for(
            lambda: (
                _per_key(server, "count by (scheduler, namespace, target) (schedlock_leader)")
                == dict.fromkeys(KEYS, 3.0)
                and _per_key(server, "sum by (scheduler, namespace, target) (schedlock_leader)")
                == dict.fromkeys(KEYS, 1.0)
                and not server.alerts()
            ),
            timeout=30,
            interval=0.2,
            what="Prometheus to scrape three sidecars, one leader per key, no alert pending",
        )
    except BaseException:
        server.stop()
        raise
    return server


@pytest.fixture
def prometheus(tmp_path: Path, prometheus_bin: Path, group: SidecarGroup) -> Iterator[Prometheus]:
    server = start_prometheus(prometheus_bin, tmp_path / "prometheus", group)
    try:
        yield server
    finally:
        server.stop()


def _per_key(server: Prometheus, expr: str) -> dict[tuple[str, str, str], float]:
    return {
        (r["metric"]["scheduler"], r["metric"]["namespace"], r["metric"]["target"]): float(
            r["value"][1]
        )
        for r in server.query(expr)
    }


def _watch_alerts(
    server: Prometheus,
    seconds: float,
    until: Callable[[list[dict[str, Any]]], bool] | None = None,
    since: float | None = None,
) -> list[tuple[float, str, str, str]]:
    """Poll /api/v1/alerts for up to ``seconds`` (or until ``until`` holds).

    Returns the transitions seen: (seconds since ``since``, alertname, scheduler, state), state
    being pending, firing or resolved.
    """
    seen: list[tuple[float, str, str, str]] = []
    states: dict[tuple[tuple[str, str], ...], str] = {}
    start = time.monotonic()
    origin = start if since is None else since
    while True:
        current = server.alerts()
        now = time.monotonic() - origin
        active = {tuple(sorted(a["labels"].items())): a["state"] for a in current}
        for key in states.keys() - active.keys():
            del states[key]
            labels = dict(key)
            seen.append((now, labels["alertname"], labels.get("scheduler", ""), "resolved"))
        for key, state in active.items():
            if states.get(key) != state:
                states[key] = state
                labels = dict(key)
                seen.append((now, labels["alertname"], labels.get("scheduler", ""), state))
        if (until is not None and until(current)) or time.monotonic() - start > seconds:
            return seen
        time.sleep(0.1)


def _timeline(seen: list[tuple[float, str, str, str]]) -> str:
    return ", ".join(f"{t:.2f}s {name}[{scheduler}] {state}" for t, name, scheduler, state in seen)


def _handover_gap(server: Prometheus, hand_overs: int = 1) -> float:
    """The publish key's hand-over gap on the database clock, from the new leader's histogram
    (``schedlock_handover_gap_seconds``), once Prometheus has scraped ``hand_overs`` of them."""
    publish = '{scheduler="publish"}'
    wait_for(
        lambda: server.query(f"sum(schedlock_handover_gap_seconds_count{publish}) >= {hand_overs}"),
        timeout=20,
        interval=0.2,
        what="the hand-over to be recorded and scraped",
    )
    return float(server.query(f"sum(schedlock_handover_gap_seconds_sum{publish})")[0]["value"][1])


def _pending_for(server: Prometheus, alertname: str, scheduler: str = ".*") -> list[float]:
    """How long each ``alertname`` alert has been active, on Prometheus's own clock
    (``ALERTS_FOR_STATE`` holds when it went pending): firing implies at least ``for:``."""
    selector = f'alertname="{alertname}", scheduler=~"{scheduler}"'
    series = server.query(f"time() - ALERTS_FOR_STATE{{{selector}}}")
    return [float(r["value"][1]) for r in series]


def test_a_killed_leader_never_fires_leader_missing(
    prometheus: Prometheus, group: SidecarGroup
) -> None:
    leader = group.wait_leader("publish")
    killed_at = time.monotonic()
    leader.signal(signal.SIGKILL)
    successor = group.wait_leader("publish", timeout=10)
    assert successor is not leader
    # The hand-over was recorded (and scraped), on the database clock: within a heartbeat of
    # the killed leader's last one.
    gap = _handover_gap(prometheus)
    assert gap < HEARTBEAT + SLACK, f"hand-over gap {gap:.3f}s"
    # No alert over the whole time one could take to fire.
    seen = _watch_alerts(prometheus, 20, since=killed_at)
    print(f"\nSIGKILL of the leader: hand-over gap {gap:.3f}s; alerts: {_timeline(seen)}")
    firing = [s for s in seen if s[3] == "firing"]
    assert not firing, f"alerts fired on a normal hand-over: {seen}"
    counts = _per_key(prometheus, "count by (scheduler, namespace, target) (schedlock_leader)")
    assert counts == dict.fromkeys(KEYS, 2.0)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "frozen"])
def test_all_sidecars_gone_fires_leader_absent(
    prometheus: Prometheus, group: SidecarGroup, sig: signal.Signals
) -> None:
    stopped_at = time.monotonic()
    for sidecar in group:
        sidecar.signal(sig)

    def absent_firing_for_every_key(alerts: list[dict[str, Any]]) -> bool:
        firing = {
            (a["labels"]["scheduler"], a["labels"]["namespace"], a["labels"]["target"])
            for a in alerts
            if a["labels"]["alertname"] == "SchedlockLeaderAbsent" and a["state"] == "firing"
        }
        return firing == KEYS

    seen = _watch_alerts(
        prometheus, FOR_SECONDS + 15, until=absent_firing_for_every_key, since=stopped_at
    )
    print(f"\n{sig.name} of every sidecar: {_timeline(seen)}")
    assert absent_firing_for_every_key(prometheus.alerts()), seen
    pending_for = _pending_for(prometheus, "SchedlockLeaderAbsent")
    assert len(pending_for) == len(KEYS) and min(pending_for) >= FOR_SECONDS, pending_for
    firing = next(
        a
        for a in prometheus.alerts()
        if a["labels"]["alertname"] == "SchedlockLeaderAbsent" and a["state"] == "firing"
    )
    assert firing["labels"]["severity"] == "critical"
    assert firing["annotations"]["runbook_url"].endswith("#schedlockleaderabsent")
    assert "default/demo" in firing["annotations"]["summary"]


def test_a_frozen_leader_fires_leader_missing_until_the_lease_hands_over(
    tmp_path: Path, migrated_database: str, prometheus_bin: Path
) -> None:
    """A leader frozen for longer than FOR (lease 12s): the other sidecars report no leader."""
    lease = 12.0
    env = {"SCHEDLOCK_LEASE_SECONDS": str(lease), "SCHEDLOCK_HEARTBEAT_SECONDS": "1"}
    replicas = SidecarGroup(tmp_path / "app", migrated_database, replicas=3, extra_env=env)
    server: Prometheus | None = None
    try:
        replicas.start()
        server = start_prometheus(prometheus_bin, tmp_path / "prometheus", replicas)
        leader = replicas.wait_leader("publish")
        frozen_at = time.monotonic()
        leader.signal(signal.SIGSTOP)

        def missing(state: str) -> Callable[[list[dict[str, Any]]], bool]:
            return lambda alerts: any(
                a["labels"]["alertname"] == "SchedlockLeaderMissing"
                and a["labels"]["scheduler"] == "publish"
                and a["state"] == state
                for a in alerts
            )

        seen = _watch_alerts(server, lease + 5, until=missing("firing"), since=frozen_at)
        assert missing("firing")(server.alerts()), seen
        assert min(_pending_for(server, "SchedlockLeaderMissing", "publish")) >= FOR_SECONDS

        def resolved(alerts: list[dict[str, Any]]) -> bool:
            return not any(
                a["labels"]["alertname"] == "SchedlockLeaderMissing"
                and a["labels"]["scheduler"] == "publish"
                for a in alerts
            )

        more = _watch_alerts(server, lease + 10, until=resolved, since=frozen_at)
        seen += [s for s in more if s[3] != "firing"]  # firing was recorded above
        print(f"\nSIGSTOP of the leader (lease {lease:g}s): {_timeline(seen)}")
        assert resolved(server.alerts()), seen
        # Cleared by the lease's hand-over: the session of the frozen leader ended a lease
        # after its last statement (database clock), never sooner.
        gap = _handover_gap(server)
        assert lease - SLACK <= gap < lease + HEARTBEAT + SLACK, f"hand-over gap {gap:.3f}s"
        names = {name for _, name, _, state in seen if state == "firing"}
        assert names <= {"SchedlockLeaderMissing"}, seen
    finally:
        if server is not None:
            server.stop()
        replicas.stop()


def _substitute(expr: str, values: dict[str, str]) -> str:
    def repl(match: re.Match[str]) -> str:
        return values[match.group(1)]

    return re.sub(r"\$\{?(\w+)\}?", repl, expr)


def test_every_dashboard_query_returns_data(
    prometheus: Prometheus, group: SidecarGroup, migrated_database: str
) -> None:
    # One hand-over (so the gap histogram has an observation), then rows fired by the new
    # leader (lateness and outcomes): a killed sidecar's series are gone with it.
    leader = group.wait_leader("publish")
    leader.signal(signal.SIGKILL)
    group.wait_leader("publish", timeout=10)
    uids = insert_rows(migrated_database, 50, start_in=0.5, spacing=0.05, prefix="dash")
    wait_published(migrated_database, "dash", len(uids))

    # The variable queries (label_values) find the running key.
    namespaces = prometheus.api("/api/v1/label/namespace/values", **{"match[]": "schedlock_leader"})
    assert "default" in namespaces
    targets = prometheus.api(
        "/api/v1/label/target/values", **{"match[]": 'schedlock_leader{namespace=~".*"}'}
    )
    assert "demo" in targets

    board = json.loads(generate.GRAFANA_DASHBOARD.read_text())  # what the chart ships
    names = {v["name"] for v in board["templating"]["list"]}
    assert {"datasource", "namespace", "target", "scheduler"} <= names
    queries = dashboard.queries(board)
    assert len(queries) >= 15
    selections = {
        "All": {"namespace": ".*", "target": ".*", "scheduler": ".*"},
        "demo": {"namespace": "default", "target": "demo", "scheduler": "publish"},
    }

    def without_data() -> list[str]:
        empty: list[str] = []
        for selection, chosen in selections.items():
            values = {
                **chosen,
                "__rate_interval": "1m",
                "__range": "1h",
                "datasource": "prometheus",
            }
            for title, expr in queries:
                promql = _substitute(expr, values)
                result = prometheus.query(promql)
                if not [r for r in result if math.isfinite(float(r["value"][1]))]:
                    empty.append(f"[{selection}] {title}: {promql} -> {result}")
        return empty

    # Rates need a few scrapes of the new leader's counters: wait until every query has data
    # (the positive signal), then say which have none if some never do.
    with contextlib.suppress(TimeoutError):
        wait_for(lambda: not without_data(), timeout=30, interval=1, what="dashboard data")
    empty = without_data()
    assert not empty, "dashboard queries without data:\n" + "\n".join(empty)
