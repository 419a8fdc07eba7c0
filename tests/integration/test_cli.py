"""The command line as people meet it: help, bad settings, migrate/publish/status."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from schedlock.core.settings import specs
from schedlock.sidecar.settings import SidecarSettings
from schedlock.store.migrations import latest_id
from testbed.sidecars import SidecarProcess, wait_for

SCHEDLOCK = str(Path(sys.executable).parent / "schedlock")
GOOD = {
    "SCHEDLOCK_DATABASE_URL": "postgresql://nobody@127.0.0.1:9/none",
    "SCHEDLOCK_TARGET": "demo",
}


def run(
    *args: str, env: dict[str, str] | None = None, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDLOCK_")}
    return subprocess.run(
        [SCHEDLOCK, *args],
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# One bad value per setting (every setting of the sidecar must appear here).
BAD_VALUES: dict[str, tuple[str, str]] = {
    "SCHEDLOCK_DATABASE_URL": ("mysql://u:secret@h/db", "postgresql://"),
    "SCHEDLOCK_NAMESPACE": ("Not_A_Label", "DNS label"),
    "SCHEDLOCK_TARGET": ("-bad-", "DNS label"),
    "SCHEDLOCK_TARGET_URL": ("ftp://x/y", "http:// or https://"),
    "SCHEDLOCK_TARGET_READY_URL": ("tcp://127.0.0.1", "tcp://host:port"),
    "SCHEDLOCK_TARGET_CHECK_SECONDS": ("0", "from 0.05 to 60"),
    "SCHEDLOCK_TARGET_FAILURE_THRESHOLD": ("0", "from 1 to 100"),
    "SCHEDLOCK_TARGET_SUCCESS_THRESHOLD": ("many", "whole number"),
    "SCHEDLOCK_HTTP_PORT": ("70000", "from 0 to 65535"),
    "SCHEDLOCK_HTTP_HOST": ("not a host!", "host name or IP address"),
    "SCHEDLOCK_HOLDER": ("x" * 80, "1 to 63"),
    "SCHEDLOCK_LEASE_SECONDS": ("1", "from 2 to 300"),
    "SCHEDLOCK_HEARTBEAT_SECONDS": ("abc", "a number"),
    "SCHEDLOCK_STANDBYS": ("-1", "from 0 to 10000"),
    "SCHEDLOCK_RESERVE_CHECK_SECONDS": ("0.1", "from 0.2 to 600"),
    "SCHEDLOCK_BATCH_SIZE": ("0", "from 1 to 10000"),
    "SCHEDLOCK_CONCURRENCY": ("lots", "whole number"),
    "SCHEDLOCK_REQUEST_TIMEOUT_SECONDS": ("-1", "from 0.1 to 600"),
    "SCHEDLOCK_POLL_SECONDS": ("nan", "from 0.1 to 3600"),
    "SCHEDLOCK_SHUTDOWN_GRACE_SECONDS": ("1e9", "from 0 to 600"),
    "SCHEDLOCK_SIGNING_SECRET_FILE": ("/no/such/file", "readable file"),
    "SCHEDLOCK_SCHEDULERS": ("all", "one of both, publish, recurring"),
    "SCHEDLOCK_MIGRATE": ("yes", "one of auto, off"),
    "SCHEDLOCK_LOG_LEVEL": ("loud", "one of debug"),
    "SCHEDLOCK_LOG_FORMAT": ("xml", "one of json, text"),
    "SCHEDLOCK_RETENTION_SECONDS": ("-5", "from 0 to 315360000"),
    "SCHEDLOCK_FAILED_RETENTION_SECONDS": ("forever", "a number"),
    "SCHEDLOCK_PRUNE_INTERVAL_SECONDS": ("0", "from 1 to 86400"),
    "SCHEDLOCK_PRUNE_BATCH_SIZE": ("5", "from 10 to 100000"),
}


def test_every_setting_is_in_the_table() -> None:
    assert {spec.env for _, spec in specs(SidecarSettings)} == set(BAD_VALUES)


@pytest.mark.parametrize("env_name", sorted(BAD_VALUES))
def test_bad_setting_is_one_line_and_exit_2(env_name: str) -> None:
    value, allowed = BAD_VALUES[env_name]
    result = run("sidecar", env={**GOOD, env_name: value})
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("schedlock sidecar: error: --")
    assert env_name in lines[0]
    assert allowed in lines[0]
    assert ":secret@" not in lines[0]  # credentials in URLs are never echoed
    assert "Traceback" not in result.stderr


def test_flags_override_environment() -> None:
    result = run("sidecar", "--lease-seconds", "1", env={**GOOD, "SCHEDLOCK_LEASE_SECONDS": "10"})
    assert result.returncode == 2 and "--lease-seconds" in result.stderr


def test_cross_field_rule_names_both_settings() -> None:
    result = run(
        "sidecar", env={**GOOD, "SCHEDLOCK_LEASE_SECONDS": "6", "SCHEDLOCK_HEARTBEAT_SECONDS": "3"}
    )
    assert result.returncode == 2
    assert "SCHEDLOCK_HEARTBEAT_SECONDS" in result.stderr and "third of the lease" in result.stderr


def test_the_lease_alone_is_enough(migrated_database: str, tmp_path: Path) -> None:
    """SCHEDLOCK_LEASE_SECONDS=5 and nothing else about timing: the heartbeat derives from it."""
    sidecar = SidecarProcess.for_stand_in_app(
        "lease-alone", tmp_path, migrated_database, SCHEDLOCK_LEASE_SECONDS="5"
    ).start()
    try:
        wait_for(sidecar.leads, timeout=60, what="the sidecar with a 5 s lease to lead")
        sidecar.signal(signal.SIGTERM)
        assert sidecar.wait(30) == 0, sidecar.log_text()
    finally:
        sidecar.stop()
    started = next(
        json.loads(line) for line in sidecar.log_text().splitlines() if '"sidecar_started"' in line
    )
    assert started["lease_seconds"] == 5


def test_inject_takes_the_lease_alone_and_refuses_a_bad_one(tmp_path: Path) -> None:
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(
        "kind: Pod\nmetadata:\n  name: p\n  annotations: {schedlock.dev/inject: 'true'}\n"
        "  labels: {app.kubernetes.io/name: billing}\nspec:\n  containers: [{name: app}]\n"
    )
    bad = run("inject", "-f", str(manifest), "--lease-seconds", "1")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert bad.stderr.startswith("schedlock inject: error: --lease-seconds: must be a number")
    good = run("inject", "-f", str(manifest), "--lease-seconds", "5")
    assert good.returncode == 0, good.stderr
    assert "SCHEDLOCK_LEASE_SECONDS" in good.stdout and "HEARTBEAT" not in good.stdout


def test_missing_required_settings() -> None:
    result = run("sidecar", env={"SCHEDLOCK_TARGET": "demo"})
    assert result.returncode == 2 and "SCHEDLOCK_DATABASE_URL: is required" in result.stderr
    result = run("migrate")
    assert result.returncode == 2 and "SCHEDLOCK_DATABASE_URL: is required" in result.stderr


def test_help_documents_every_setting() -> None:
    text = run("sidecar", "--help").stdout
    for _, spec in specs(SidecarSettings):
        assert spec.flag in text and spec.env in text


def test_migrate_publish_status_round_trip(migrated_database: str) -> None:
    env = {"SCHEDLOCK_DATABASE_URL": migrated_database}
    assert "schema is current" in run("migrate", env=env).stdout
    published = run(
        "publish",
        "--target",
        "billing",
        "--at",
        "2030-01-01T09:00:00Z",
        "--payload",
        '{"q": "\\"quoted\\" ü; DROP TABLE x;--"}',
        "--namespace",
        "shop",
        env=env,
    )
    assert published.returncode == 0, published.stderr
    row = json.loads(published.stdout)
    assert row["dueAt"] == "2030-01-01T09:00:00Z" and row["target"] == "billing"
    bad = run("publish", "--target", "billing", "--at", "tomorrow", env=env)
    assert bad.returncode == 2 and "--at" in bad.stderr and "RFC 3339" in bad.stderr
    bad_json = run("publish", "--target", "billing", "--at", "now", "--payload", "[1]", env=env)
    assert bad_json.returncode == 2 and "JSON object" in bad_json.stderr
    bad_cron = run("schedule", "--target", "billing", "--cron", "61 * * * *", env=env)
    assert bad_cron.returncode == 2 and "out of range" in bad_cron.stderr
    assert run("status", env=env).stdout.startswith("no lock keys yet")


def one_line_error(result: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    assert result.returncode == code, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith("schedlock migrate: error: ")
    for word in words:
        assert word in lines[0]


@pytest.mark.parametrize("dialect", ["postgres", "sqlite"])
def test_migrate_to_rolls_back_refuses_data_loss_and_rolls_forward(
    migrated_database: str, tmp_path: Path, dialect: str
) -> None:
    """`schedlock migrate --to 2` as a rollback to c8e0198 runs it (the upgrade test too)."""
    url = migrated_database if dialect == "postgres" else f"sqlite:///{tmp_path / 'm.db'}"
    env = {"SCHEDLOCK_DATABASE_URL": url}
    latest = run("migrate", env=env)
    assert latest.returncode == 0, latest.stderr
    down = run("migrate", "--to", "2", env=env)
    assert down.returncode == 0, down.stderr
    newest = latest_id("sqlite")
    assert down.stdout.startswith(
        f"reverted migrations {', '.join(map(str, range(newest, 2, -1)))}"
    )
    assert down.stdout.strip().endswith("schema at 2")
    one_line_error(run("migrate", "--to", "0", env=env), 2, "loses data", "--force")
    one_line_error(run("migrate", "--to", "999", env=env), 2, "999 is unknown")
    bad = run("migrate", "--to", "two", env=env)
    assert bad.returncode == 2 and "--to" in bad.stderr and "Traceback" not in bad.stderr
    assert run("migrate", "--to", "2", env=env).stdout.startswith("schema at migration 2")
    up = run("migrate", env=env)
    applied = ", ".join(map(str, range(3, newest + 1)))
    assert up.returncode == 0 and up.stdout.startswith(f"applied migrations {applied}"), up.stderr
    gone = run("migrate", "--to", "0", "--force", env=env)
    assert gone.returncode == 0 and gone.stdout.strip().endswith("schema at 0"), gone.stderr


def test_migrate_help_says_how_to_roll_back() -> None:
    text = " ".join(run("migrate", "--help").stdout.split())
    for words in ("--to N", "down step", "newest first", "--force", "lose data", "additive"):
        assert words in text, words


def test_unreachable_database_is_a_clear_error() -> None:
    result = run("status", env={"SCHEDLOCK_DATABASE_URL": "postgresql://u@127.0.0.1:9/db"})
    assert result.returncode == 1
    assert result.stderr.startswith("schedlock status: error: cannot read the status:")
    assert "Traceback" not in result.stderr


OPERATOR_GOOD = {"SCHEDLOCK_DATABASE_URL": "postgresql://nobody@127.0.0.1:9/none"}
OPERATOR_BAD_VALUES: dict[str, tuple[str, str]] = {
    "SCHEDLOCK_DATABASE_URL": ("sqlite:///x.db", "must be a postgresql:// URL"),
    "SCHEDLOCK_WATCH_NAMESPACES": ("good,Bad_One", "namespace names"),
    "SCHEDLOCK_HEALTH_PORT": ("0", "from 1 to 65535"),
    "SCHEDLOCK_WEBHOOK_PORT": ("99999", "from 1 to 65535"),
    "SCHEDLOCK_WEBHOOK_HOST": ("no host!", "host name or IP address"),
    "SCHEDLOCK_WEBHOOK_CERT_FILE": ("/no/cert.pem", "readable file"),
    "SCHEDLOCK_WEBHOOK_KEY_FILE": ("/no/key.pem", "readable file"),
    "SCHEDLOCK_SIDECAR_IMAGE": ("x" * 300, "1 to 253"),
    "SCHEDLOCK_SIDECAR_DATABASE_SECRET": ("Not_A_Name", "DNS subdomain"),
    "SCHEDLOCK_SIDECAR_DATABASE_SECRET_KEY": ("", "1 to 253"),
    "SCHEDLOCK_SIDECAR_LEASE_SECONDS": ("1", "from 2 to 300"),
    "SCHEDLOCK_SIDECAR_RESOURCES": ("{cpu: 1}", "JSON object"),
    "SCHEDLOCK_SIDECAR_SIGNING_SECRET": ("billing-hmac/a key", "'a key' is not a Secret key"),
    "SCHEDLOCK_SYNC_SWEEP_SECONDS": ("0", "from 1 to 3600"),
    "SCHEDLOCK_SYNC_CATCH_UP_SECONDS": ("-1", "from 0 to 604800"),
    "SCHEDLOCK_REASSERT_SECONDS": ("0.5", "from 1 to 3600"),
    "SCHEDLOCK_HOLDER": ("x" * 64, "1 to 63"),
    "SCHEDLOCK_MIGRATE": ("maybe", "one of auto, off"),
    "SCHEDLOCK_LOG_LEVEL": ("chatty", "one of debug"),
    "SCHEDLOCK_LOG_FORMAT": ("yaml", "one of json, text"),
    "SCHEDLOCK_RETENTION_SECONDS": ("1e10", "from 0 to 315360000"),
    "SCHEDLOCK_FAILED_RETENTION_SECONDS": ("-1", "from 0 to 315360000"),
    "SCHEDLOCK_PRUNE_INTERVAL_SECONDS": ("often", "a number"),
    "SCHEDLOCK_PRUNE_BATCH_SIZE": ("1000000", "from 10 to 100000"),
}


def test_every_operator_setting_is_in_the_table() -> None:
    from schedlock.operator.settings import OperatorSettings

    assert {spec.env for _, spec in specs(OperatorSettings)} == set(OPERATOR_BAD_VALUES)


@pytest.mark.parametrize("env_name", sorted(OPERATOR_BAD_VALUES))
def test_bad_operator_setting_is_one_line_and_exit_2(env_name: str) -> None:
    value, allowed = OPERATOR_BAD_VALUES[env_name]
    env = {**OPERATOR_GOOD, env_name: value}
    if env_name == "SCHEDLOCK_SIDECAR_DATABASE_SECRET_KEY":
        result = run("operator", "--sidecar-database-secret-key", " ", env=OPERATOR_GOOD)
    else:
        result = run("operator", env=env)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("schedlock operator: error: --")
    assert allowed in lines[0]
