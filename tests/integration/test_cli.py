"""The command line as people meet it: help, bad settings, migrate/publish/status."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from schedlock.core.settings import specs
from schedlock.sidecar.settings import SidecarSettings
from schedlock.store import PublishRecord, open_store
from schedlock.store.migrations import latest_id
from schedlock.store.postgres import OPERATOR_GRANTS
from testbed.pg_fixtures import PostgresService, as_role
from testbed.sidecars import SidecarProcess, wait_for

SCHEDLOCK = str(Path(sys.executable).parent / "schedlock")
GOOD = {
    "SCHEDLOCK_DATABASE_URL": "postgresql://nobody@127.0.0.1:9/none",
    "SCHEDLOCK_TARGET": "demo",
}


def run(
    *args: str, env: dict[str, str] | None = None, timeout: float = 30, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDLOCK_")}
    return subprocess.run(
        [SCHEDLOCK, *args],
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        input=stdin,
    )


# One bad value per setting (every setting of the sidecar must appear here).
BAD_VALUES: dict[str, tuple[str, str]] = {
    "SCHEDLOCK_DATABASE_URL": ("mysql://u:secret@h/db", "postgresql://"),
    "SCHEDLOCK_DATABASE_SCHEMA": ("Schedlock", "lower-case letters"),
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


def one_line_error(
    result: subprocess.CompletedProcess[str], code: int, *words: str, command: str = "migrate"
) -> str:
    """The one line of a refusal (exit ``code``, nothing else on stderr, no traceback)."""
    assert result.returncode == code, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[:2000]
    assert lines[0].startswith(f"schedlock {command}: error: ")
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def test_every_setting_is_in_the_table() -> None:
    assert {spec.env for _, spec in specs(SidecarSettings)} == set(BAD_VALUES)


@pytest.mark.parametrize("env_name", sorted(BAD_VALUES))
def test_bad_setting_is_one_line_and_exit_2(env_name: str) -> None:
    value, allowed = BAD_VALUES[env_name]
    result = run("sidecar", env={**GOOD, env_name: value})
    line = one_line_error(result, 2, env_name, allowed, command="sidecar")
    assert line.startswith("schedlock sidecar: error: --")
    assert ":secret@" not in line  # credentials in URLs are never echoed


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
        "kind: Pod\nmetadata:\n  name: p\n"
        "  labels: {schedlock.dev/inject: 'true', app.kubernetes.io/name: billing}\n"
        "spec:\n  containers: [{name: app}]\n"
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


def test_status_runs_under_the_role_migrate_grants_the_operator(
    postgres: PostgresService, tmp_path: Path
) -> None:
    """`schedlock status` as the operator's role, the one an operator's Secret holds: the role
    `migrate --grant-operator` made, and a role with only the operator's required grants (what
    the operator checks at start; pruning's are optional) and the namespace mapping (0008) —
    it reads every key, its lock holder and its reserves (schedlock_reserves).  Before the
    mapping, row-level security hides every key, and status says so and how to fix it."""
    url = postgres.create_database()
    granted_role, required_role = (f"op_{kind}_{uuid.uuid4().hex[:8]}" for kind in "gr")
    for role in (granted_role, required_role):
        postgres.execute(f'CREATE ROLE "{role}" LOGIN')
    sidecar = SidecarProcess.for_stand_in_app("status-as-operator", tmp_path, url)
    try:
        owner = {"SCHEDLOCK_DATABASE_URL": url}
        assert run("migrate", env=owner).returncode == 0
        granted = run("migrate", "--grant-operator", granted_role, env=owner)
        assert granted.returncode == 0, granted.stderr
        required = open_store(as_role(url, required_role))
        lacking = asyncio.run(required.missing_privileges("operator"))
        assert lacking == (required_role, ["USAGE on schema schedlock"])
        postgres.execute(f'GRANT USAGE ON SCHEMA schedlock TO "{required_role}"', url=url)
        for privileges, objects in OPERATOR_GRANTS:
            for obj in objects:
                postgres.execute(f'GRANT {privileges} ON {obj} TO "{required_role}"', url=url)
        assert asyncio.run(required.missing_privileges("operator")) == (required_role, [])
        sidecar.start()  # a key, its term and its lock, so that status has a row to show
        wait_for(sidecar.leads, timeout=60, what="the sidecar to lead")
        unmapped = run(
            "status", "--json", env={"SCHEDLOCK_DATABASE_URL": as_role(url, required_role)}
        )
        assert unmapped.returncode == 0 and json.loads(unmapped.stdout) == [], unmapped.stderr
        assert unmapped.stderr.strip() == (
            f"role {required_role} may serve no namespace: row-level security hides every key; "
            f"as the schema owner run `schedlock migrate --grant-operator {required_role}` "
            "(every namespace) to see them all"
        )
        # what `migrate --grant-operator` records besides its grants, written by hand
        postgres.execute(
            f"INSERT INTO schedlock_namespace_roles (role, namespace) VALUES ('{required_role}', '*')",
            url=url,
        )
        for role in (granted_role, required_role):
            as_operator = {"SCHEDLOCK_DATABASE_URL": as_role(url, role)}
            status = run("status", "--json", env=as_operator)
            assert status.returncode == 0, (role, status.stderr)
            keys = json.loads(status.stdout)
            assert {(k["namespace"], k["target"]) for k in keys} == {("default", "demo")}, keys
            assert all(k["leader"] == "status-as-operator" for k in keys), keys
            assert all(k["reserves"] == [] for k in keys), keys
            table = run("status", env=as_operator)
            assert table.returncode == 0 and "demo" in table.stdout, (role, table.stderr)
            assert table.stderr == "", table.stderr  # every namespace: nothing hidden
    finally:
        sidecar.stop()
        postgres.drop_database(url)
        for role in (granted_role, required_role):
            postgres.execute(f'DROP ROLE IF EXISTS "{role}"')


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
    where = " in PostgreSQL schema schedlock" if dialect == "postgres" else ""
    assert down.stdout.strip().endswith(f"schema at 2{where}")
    one_line_error(run("migrate", "--to", "0", env=env), 2, "loses data", "--force")
    one_line_error(run("migrate", "--to", "999", env=env), 2, "999 is unknown")
    bad = run("migrate", "--to", "two", env=env)
    assert bad.returncode == 2 and "--to" in bad.stderr and "Traceback" not in bad.stderr
    assert run("migrate", "--to", "2", env=env).stdout.startswith("schema at migration 2")
    up = run("migrate", env=env)
    applied = ", ".join(map(str, range(3, newest + 1)))
    assert up.returncode == 0 and up.stdout.startswith(f"applied migrations {applied}"), up.stderr
    gone = run("migrate", "--to", "0", "--force", env=env)
    assert gone.returncode == 0 and gone.stdout.strip().endswith(f"schema at 0{where}"), gone.stderr


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
    "SCHEDLOCK_DATABASE_SCHEMA": ("pg_catalog", "not pg_"),
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
    line = one_line_error(result, 2, allowed, command="operator")
    assert line.startswith("schedlock operator: error: --")


# -- issue 21: the attacks on publish/schedule/sidecar/inject, each with the line it now gives --

DEEP = '{"a":' * 900 + "{}" + "}" * 900
PUBLISH_ATTACKS: dict[str, tuple[list[str], str]] = {
    "nested 900 deep": (["--payload", DEEP], "--payload: payload nests deeper than 32 levels"),
    "at +99999999999h": (["--at", "+99999999999h"], "--at: must be at most 100 years from now"),
    "at year 9999 minus an offset": (
        ["--at", "9999-12-31T23:59:59-23:00"],
        "--at: must be within 100 years of now",
    ),
    "NUL": (["--payload", '{"a": "\\u0000"}'], "--payload: payload string holds a NUL character"),
    "NaN": (["--payload", '{"a": NaN}'], "--payload: payload holds NaN, which JSON cannot carry"),
    "Infinity": (
        ["--payload", '{"a": 1e999}'],
        "--payload: payload holds inf, which JSON cannot carry",
    ),
    "lone surrogate": (
        ["--payload", '{"a": "\\udc00"}'],
        "--payload: payload string holds a lone UTF-16 surrogate",
    ),
    "5000-digit integer": (
        ["--payload", '{"a": ' + "7" * 5000 + "}"],
        "--payload: payload cannot be read: Exceeds the limit (4300 digits)",
    ),
    "120 KB": (
        ["--payload", '{"a": "' + "x" * 120_000 + '"}'],
        "--payload: payload is 120009 bytes as JSON; at most 16384 bytes (16 KiB) are allowed",
    ),
    "name of 100 KB": (["--name", "n" * 100_000], "--name: must be 1 to 253 printable characters"),
    "name with escapes": (
        ["--name", "job\x1b]0;owned\x07"],
        "--name: must be 1 to 253 printable characters, got 'job\\x1b]0;owned\\x07'",
    ),
    "name with an undecodable byte": (["--name", "a\udcffb"], "--name: must be 1 to 253"),
    "attempts of 5000 digits": (["--max-attempts", "9" * 5000], "(5000 characters)"),
}


@pytest.mark.parametrize("attack", sorted(PUBLISH_ATTACKS))
def test_publish_attack_is_one_line_and_exit_2(migrated_database: str, attack: str) -> None:
    extra, line = PUBLISH_ATTACKS[attack]
    args = {"--target": "billing", "--at": "+1h", **dict(zip(extra[::2], extra[1::2], strict=True))}
    result = run(
        "publish",
        *[part for pair in args.items() for part in pair],
        env={"SCHEDLOCK_DATABASE_URL": migrated_database},
    )
    shown = one_line_error(result, 2, line, command="publish")
    assert len(shown) < 400  # the value is cut, not echoed whole


def test_payload_from_a_file_or_stdin_lands_whole(migrated_database: str, tmp_path: Path) -> None:
    """--payload @FILE and - carry what argv cannot (pretty-printed, 16 KiB), not more."""
    env = {"SCHEDLOCK_DATABASE_URL": migrated_database}
    payload = {"invoice": 42, "lines": ["x" * 100] * 150, "note": "é😀"}
    file = tmp_path / "payload.json"
    file.write_text(json.dumps(payload, indent=4))
    base = ["publish", "--target", "billing", "--at", "+1h"]
    from_file = run(*base, "--payload", f"@{file}", env=env)
    from_stdin = run(*base, "--payload", "-", env=env, stdin=json.dumps(payload))
    for result in (from_file, from_stdin):
        assert result.returncode == 0, result.stderr
        uid = json.loads(result.stdout)["uid"]
        record = asyncio.run(_get_publish(migrated_database, uid))
        assert record is not None and record.payload == payload
    one_mb = '{"a": "' + "z" * 1_000_000 + '"}'
    file.write_text(one_mb)
    for result in (
        run(*base, "--payload", f"@{file}", env=env),
        run(*base, "--payload", "-", env=env, stdin=one_mb),
    ):
        one_line_error(result, 2, "holds more than 65536 bytes", command="publish")
    missing = run(*base, "--payload", "@/no/such.json", env=env)
    one_line_error(missing, 2, "cannot read the payload file '/no/such.json'", command="publish")


async def _get_publish(url: str, uid: str) -> PublishRecord | None:
    store = open_store(url)
    try:
        return await store.get_publish(uid)
    finally:
        await store.close()


def test_schedule_refuses_what_the_cluster_refuses(migrated_database: str) -> None:
    env = {"SCHEDLOCK_DATABASE_URL": migrated_database}
    base = ["schedule", "--target", "billing"]
    long_cron = run(*base, "--cron", "* " * 5000, env=env)
    one_line_error(long_cron, 2, "--cron is", "at most 128", command="schedule")
    zone = run(*base, "--cron", "@daily", "--time-zone", "Europe/" + "x" * 5000, env=env)
    one_line_error(zone, 2, "--time-zone is", "at most 64", command="schedule")
    deep = run(*base, "--cron", "@daily", "--payload", "[" * 3000, env=env)
    one_line_error(deep, 2, "--payload: payload nests deeper than 32 levels", command="schedule")


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://127.0.0.1:99999/hook", "port from 1 to 65535, got 'http://127.0.0.1:99999/hook'"),
        ("http://127.0.0.1:abc/hook", "port from 1 to 65535"),
        ("abc", "must be an http:// or https:// URL"),
        ("http://[::1/hook", "with a host"),
    ],
)
def test_sidecar_target_url_is_checked_at_start(url: str, says: str) -> None:
    result = run("sidecar", env={**GOOD, "SCHEDLOCK_TARGET_URL": url})
    one_line_error(result, 2, "--target-url / SCHEDLOCK_TARGET_URL: ", says, command="sidecar")


@pytest.mark.parametrize(
    ("manifest", "says"),
    [
        ("kind: Pod\nmetadata: [a]\n", "document 1 (Pod): metadata is an array, not an object"),
        ("kind: Deployment\nspec: {template: x}\n", "spec.template is a string, not an object"),
        ("[" * 3000, "the manifests are nested too deep to be read"),
        ("a: " + "1" * 5000 + "\n", "the manifests hold a value that cannot be read"),
    ],
)
def test_inject_of_a_malformed_manifest_is_one_line(manifest: str, says: str) -> None:
    result = run("inject", stdin=manifest)
    one_line_error(result, 2, says, command="inject")
    assert result.stdout == ""
