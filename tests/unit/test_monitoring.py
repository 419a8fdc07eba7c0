"""Monitoring as code: the committed files are the generator's output, every alert is complete
and has a runbook, both alerting backends alert on the same PromQL, the dashboard is stable."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from monitoring import alerts, dashboard, generate
from schedlock.sidecar.metrics import GAP_BUCKETS, SidecarMetrics
from schedlock.store.models import HistoryStats
from schedlock.store.retention import PassReport, RetentionPolicy, retention_by_state

REPO = Path(__file__).resolve().parents[2]
OPERATIONS = REPO / "docs" / "operations.md"
LEADER_RULES = {"SchedlockLeaderMissing", "SchedlockLeaderAbsent"}


def _load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def _prometheus_rules() -> list[dict[str, Any]]:
    (group,) = _load(generate.PROMETHEUS_RULES)["groups"]
    return list(group["rules"])


def _grafana_group() -> dict[str, Any]:
    document = _load(generate.GRAFANA_ALERTS)
    assert document["apiVersion"] == 1
    (group,) = document["groups"]
    return dict(group)


def test_committed_files_are_the_generator_output() -> None:
    stale = generate.stale()
    assert not stale, "run `.venv/bin/python -m monitoring.generate`:\n" + "\n".join(stale.values())
    assert generate.main(["--check"]) == 0


def test_check_fails_on_a_stale_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("PROMETHEUS_RULES", "GRAFANA_ALERTS", "GRAFANA_DASHBOARD"):
        monkeypatch.setattr(generate, name, tmp_path / getattr(generate, name).name)
    assert generate.main([]) == 0
    assert generate.main(["--check"]) == 0
    edited = tmp_path / "prometheus-rules.yaml"
    edited.write_text(edited.read_text().replace("for: 1m", "for: 2m", 1))
    assert generate.main(["--check"]) == 1
    err = capsys.readouterr().err
    assert "prometheus-rules.yaml is out of date" in err
    assert "-        for: 2m" in err and "+        for: 1m" in err


def test_every_prometheus_alert_is_complete() -> None:
    rules = _prometheus_rules()
    assert [r["alert"] for r in rules] == [a.name for a in alerts.ALERTS]
    assert len({r["alert"] for r in rules}) == len(rules)
    for rule in rules:
        name = rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning"), name
        annotations = rule["annotations"]
        assert set(annotations) == {"summary", "description", "runbook_url"}, name
        assert annotations["runbook_url"] == (
            "https://github.com/schedlock/schedlock/blob/main/docs/operations.md#" + name.lower()
        )
        # Templated with the labels that identify the instance (lock key or sidecar).
        assert "{{ $labels." in annotations["summary"], name
        assert "{{ $labels." in annotations["description"], name


def test_critical_alerts_are_the_leadership_ones() -> None:
    critical = {a.name for a in alerts.ALERTS if a.severity == "critical"}
    # A squatted lock is a key no sidecar can lead (SchedlockLeaderMissing fires too): this one
    # says why, and that a credential leaked.
    assert critical == LEADER_RULES | {"SchedlockMultipleLeaders", "SchedlockLockHeldByForeignRole"}


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes."""
    anchors = set()
    for line in markdown.splitlines():
        match = re.match(r"#{1,6}\s+(.*)$", line)
        if match:
            text = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower())
            anchors.add(text.replace(" ", "-"))
    return anchors


def test_every_runbook_anchor_exists_in_the_operations_guide() -> None:
    text = OPERATIONS.read_text()
    anchors = _anchors(text)
    headings = {line.lstrip("#").strip() for line in text.splitlines() if line.startswith("#")}
    for alert in alerts.ALERTS:
        assert alert.name in headings, f"docs/operations.md has no section '{alert.name}'"
        assert alert.anchor in anchors
        assert alert.runbook_url.endswith("#" + alert.anchor)


def test_the_fast_variant_changes_only_for_and_interval() -> None:
    real = alerts.prometheus_rules()
    fast = alerts.prometheus_rules(for_override="5s", interval="1s")
    assert fast["groups"][0]["interval"] == "1s"
    for slow_rule, fast_rule in zip(
        real["groups"][0]["rules"], fast["groups"][0]["rules"], strict=True
    ):
        assert fast_rule["expr"] == slow_rule["expr"]
        assert fast_rule["labels"] == slow_rule["labels"]
        assert fast_rule.get("for", "0s") == ("5s" if "for" in slow_rule else "0s")


def test_thresholds_match_the_exported_metrics() -> None:
    assert alerts.HANDOVER_GAP_SECONDS in GAP_BUCKETS
    metrics = SidecarMetrics()
    metrics.init_key("publish", "shop", "billing")
    metrics.init_history(retention_by_state(RetentionPolicy()))
    # Table sizes exist once a pruning attempt looked at them.
    metrics.observe_pass(PassReport("pod", won=False, stats=HistoryStats(publishes_bytes=8192)))
    samples = {name for name, _, _ in metrics.registry.samples()}
    buckets = {
        labels["le"]
        for name, labels, _ in metrics.registry.samples()
        if name == "schedlock_handover_gap_seconds_bucket"
    }
    (handover,) = (a for a in alerts.ALERTS if a.name == "SchedlockHandoverGapHigh")
    (bound,) = (b for b in buckets if b != "+Inf" and float(b) == alerts.HANDOVER_GAP_SECONDS)
    assert f'{{le="{bound}"}}' in handover.value
    used = set()
    for alert in alerts.ALERTS:
        used |= set(re.findall(r"schedlock_[a-z_]+", alert.value))
    for _, expr in dashboard.queries():
        used |= set(re.findall(r"schedlock_[a-z_]+", expr))
    assert used <= samples, f"queries use metrics the sidecar does not export: {used - samples}"


def test_grafana_rules_mirror_the_prometheus_rules() -> None:
    group = _grafana_group()
    assert group["orgId"] == 1
    assert group["folder"] == "schedlock"
    assert re.fullmatch(r"\d+[sm]", group["interval"])
    prometheus = {r["alert"]: r for r in _prometheus_rules()}
    assert [r["title"] for r in group["rules"]] == list(prometheus)
    uids = [r["uid"] for r in group["rules"]]
    assert len(set(uids)) == len(uids)
    ops = {"gt": ">", "lt": "<"}
    for rule in group["rules"]:
        name = rule["title"]
        prom = prometheus[name]
        assert re.fullmatch(r"[a-z0-9-]{1,40}", rule["uid"]), rule["uid"]
        assert rule["condition"] == "C"
        query, reduce, threshold = rule["data"]
        assert [d["refId"] for d in rule["data"]] == ["A", "B", "C"]
        assert query["datasourceUid"] == "${DS_PROMETHEUS}"
        assert query["model"]["instant"] is True
        assert reduce["datasourceUid"] == threshold["datasourceUid"] == "__expr__"
        assert (reduce["model"]["type"], reduce["model"]["expression"]) == ("reduce", "A")
        assert (threshold["model"]["type"], threshold["model"]["expression"]) == ("threshold", "B")
        (condition,) = threshold["model"]["conditions"]
        op = ops[condition["evaluator"]["type"]]
        (limit,) = condition["evaluator"]["params"]
        # The same PromQL: Prometheus compares in the query, Grafana in expression C.
        assert prom["expr"] == f"{query['model']['expr']} {op} {limit:g}"
        assert rule["for"] == prom.get("for", "0s")
        assert rule["labels"] == prom["labels"]
        assert rule["annotations"]["runbook_url"] == prom["annotations"]["runbook_url"]
        assert rule["execErrState"] in ("Error", "Alerting", "OK")
        assert rule["noDataState"] == ("Alerting" if name in LEADER_RULES else "OK")
        for key in ("summary", "description"):
            text = rule["annotations"][key]
            assert not re.search(r"\$value\b", text), (name, text)
            if re.search(r"\$value\b", prom["annotations"][key]):
                assert "$values.B.Value" in text


def test_grafana_interpolates_nothing_by_accident() -> None:
    """Grafana expands $VARS in provisioning files (labels, queries; not annotations)."""
    for rule in _grafana_group()["rules"]:
        without_annotations = {k: v for k, v in rule.items() if k != "annotations"}
        dollars = re.findall(r"\$\{?\w+\}?", json.dumps(without_annotations))
        assert set(dollars) == {"${DS_PROMETHEUS}"}, (rule["title"], dollars)


def test_dashboard_identity_and_variables() -> None:
    board = json.loads(generate.GRAFANA_DASHBOARD.read_text())
    assert board == dashboard.dashboard()
    assert board["uid"] == "schedlock-overview"
    assert board["title"] == "schedlock"
    assert "id" not in board
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    # The query itself (Grafana's model has no `definition`, the UI's copy of it).
    assert variables["namespace"]["query"]["query"] == "label_values(schedlock_leader, namespace)"
    assert variables["target"]["query"]["query"].startswith("label_values(schedlock_leader{")
    for name in ("namespace", "target", "scheduler"):
        assert variables[name]["type"] == "query"
        assert variables[name]["includeAll"] and variables[name]["allValue"] == ".*"
        assert variables[name]["datasource"] == {"type": "prometheus", "uid": "${datasource}"}


def test_dashboard_panels() -> None:
    board = dashboard.dashboard()
    panels = board["panels"]
    ids = [p["id"] for p in panels]
    assert len(set(ids)) == len(ids)
    titles = {p["title"] for p in panels}
    for expected in (
        "Leader by pod",
        "Leaders per key",
        "Hand-over gap",
        "Fire lateness",
        "Fire outcomes",
        "Due backlog",
        "Oldest due age",
        "Leadership transitions",
        "Database connected",
        "Database sessions",
        "Roles per key",
        "Refused connections",
    ):
        assert expected in titles
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(set(refs)) == len(refs)
        for target in panel["targets"]:
            # Regex matchers, so "All" (.*) and multi-value selections work.
            assert 'namespace=~"$namespace"' in target["expr"], panel["title"]
    (timeline,) = (p for p in panels if p["title"] == "Leader by pod")
    assert timeline["type"] == "state-timeline"
    assert "pod" in timeline["targets"][0]["expr"]
    per_sidecar = (
        "schedlock_database_up",
        "schedlock_build_info",
        "schedlock_database_sessions",
        "schedlock_database_connections_refused_total",
        "schedlock_history_",  # the database's, whatever the key
    )
    key_queries = [e for _, e in dashboard.queries(board) if not any(m in e for m in per_sidecar)]
    for expr in key_queries:
        assert 'target=~"$target"' in expr and 'scheduler=~"$scheduler"' in expr, expr
