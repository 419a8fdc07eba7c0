"""promtool on the generated Prometheus rules: they load, and the unit tests in tests/monitoring
prove every alert both fires when it must and stays quiet through normal hand-overs."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from monitoring import alerts, generate

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "charts" / "schedlock" / "files" / "prometheus-rules.yaml"
RULE_TESTS = sorted((REPO / "tests" / "monitoring").glob("*.yaml"))
ALERT_NAMES = {a.name for a in alerts.ALERTS}


def run(*argv: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in argv], check=False, capture_output=True, text=True)


def test_promtool_checks_the_rules(promtool_bin: Path) -> None:
    result = run(promtool_bin, "check", "rules", RULES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alerts.ALERTS)} rules found" in result.stdout


def test_promtool_checks_the_fast_variant_used_by_the_e2e_tests(
    promtool_bin: Path, tmp_path: Path
) -> None:
    fast = tmp_path / "rules.yaml"
    fast.write_text(generate.prometheus_rules_yaml(for_override="5s", interval="1s"))
    result = run(promtool_bin, "check", "rules", fast)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_rule_unit_tests_pass(promtool_bin: Path) -> None:
    assert RULE_TESTS, "no promtool rule tests in tests/monitoring"
    result = run(promtool_bin, "test", "rules", *RULE_TESTS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "FAILED" not in result.stdout + result.stderr


def _rule_tests() -> list[dict[str, Any]]:
    tests: list[dict[str, Any]] = []
    for path in RULE_TESTS:
        document = yaml.safe_load(path.read_text())
        assert document["rule_files"] == ["../../charts/schedlock/files/prometheus-rules.yaml"]
        tests.extend(document["tests"])
    return tests


def _fed_alerts(test: dict[str, Any]) -> set[str]:
    """The alerts whose expression reads a metric among the test's input series."""
    metrics = {str(s["series"]).split("{", 1)[0] for s in test["input_series"]}
    return {a.name for a in alerts.ALERTS if any(m in a.value for m in metrics)}


def test_rule_tests_cover_every_alert_firing_and_quiet() -> None:
    """Each alert has a case where it fires, and a normal-operation case where no schedlock
    alert ever fires over the whole test (a max_over_time of ALERTS that must be empty)."""
    fires: set[str] = set()
    quiet: set[str] = set()
    for test in _rule_tests():
        for check in test.get("alert_rule_test", []):
            if check.get("exp_alerts"):
                fires.add(check["alertname"])
        for check in test.get("promql_expr_test", []):
            expr = check["expr"].replace(" ", "")
            if (
                expr.startswith('max_over_time(ALERTS{alertname=~"Schedlock.*"')
                and check["exp_samples"] == []
            ):
                quiet |= _fed_alerts(test)
    assert fires == ALERT_NAMES, f"alerts never shown firing: {ALERT_NAMES - fires}"
    assert quiet == ALERT_NAMES, f"alerts never shown quiet: {ALERT_NAMES - quiet}"


def test_rule_tests_fail_when_the_for_durations_are_dropped(
    promtool_bin: Path, tmp_path: Path
) -> None:
    """The quiet cases really depend on `for:`: without it, normal hand-overs would page."""
    rules = tmp_path / "charts" / "schedlock" / "files" / "prometheus-rules.yaml"
    rules.parent.mkdir(parents=True)
    rules.write_text(generate.prometheus_rules_yaml(for_override="0s"))
    tests_dir = tmp_path / "tests" / "monitoring"
    tests_dir.mkdir(parents=True)
    for path in RULE_TESTS:
        shutil.copy(path, tests_dir / path.name)
    result = run(promtool_bin, "test", "rules", *sorted(tests_dir.glob("*.yaml")))
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    for name in ("SchedlockLeaderMissing", "SchedlockMultipleLeaders", "SchedlockLeaderAbsent"):
        assert name in output, output
