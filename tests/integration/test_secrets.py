"""No secret in any output: every URL form, through `schedlock status`, `migrate`, a running
sidecar (its logs and /readyz) and a running operator (its logs and /readyz, before it ever
needs Kubernetes), against a PostgreSQL server that checks passwords.

The password is distinctive (``S3cr3t-%zz-🙂``: a percent sign libpq cannot decode, an emoji
that percent-encodes to four bytes); neither it nor any spelling of it, nor its first six
characters, may appear in stdout, stderr, the log or /readyz.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest

from testbed.operators import OperatorProcess
from testbed.pg import PostgresServer
from testbed.pg_fixtures import RUNTIME_ENV
from testbed.sidecars import SidecarProcess, http_get, wait_for

PASSWORD = "S3cr3t-%zz-🙂"
ENCODED = quote(PASSWORD, safe="")
SCHEDLOCK = str(Path(sys.executable).parent / "schedlock")
NOT_PARSED = "the URL could not be parsed"
AUTH_FAILED = "authentication failed: the database refused the credentials"


def leaks(text: str) -> list[str]:
    spellings = {PASSWORD, ENCODED, ENCODED.lower(), quote(PASSWORD), "S3cr3t"}
    return [s for s in spellings if s in text]


@pytest.fixture(scope="module")
def checking_server() -> Iterator[PostgresServer]:
    """A server that checks passwords on loopback (the test bed's trusts everyone there)."""
    server = PostgresServer(Path(tempfile.mkdtemp(prefix="schedlock-secrets-")))
    server.start()
    try:
        with psycopg.connect(server.url(), autocommit=True) as conn:
            conn.execute("CREATE ROLE app LOGIN PASSWORD 'the-right-one'")
        (server.datadir / "pg_hba.conf").write_text(
            "host all postgres 127.0.0.1/32 trust\nhost all all 127.0.0.1/32 scram-sha-256\n"
        )
        with psycopg.connect(server.url(), autocommit=True) as conn:
            conn.execute("SELECT pg_reload_conf()")
        yield server
    finally:
        server.destroy()  # its data under /var/tmp and its directory too


def refused_forms() -> list[tuple[str, str]]:
    """(URL, the one line's tail): refused at start, exit status 2."""
    return [
        (
            f"postgresql://app:{PASSWORD}@127.0.0.1:{{port}}/postgres",
            f"{NOT_PARSED} (invalid percent-encoding",
        ),
        (f"postgresql://app:{ENCODED}@[::1", f"{NOT_PARSED} (no ']' closes the IPv6 address)"),
        (
            f"host=127.0.0.1 port={{port}} user=app password='{PASSWORD}' dbname=postgres",
            "got 'host=127.0.0.1 port={port} user=app password=*** dbname=postgres'",
        ),
        (
            f"mysql://app:{PASSWORD}@127.0.0.1/db?password={ENCODED}",
            "got 'mysql://app:***@127.0.0.1/db?password=***'",
        ),
        (
            f"postgresql://app:{PASSWORD.replace('%', '@')}@127.0.0.1:{{port}}/postgres",
            "percent-encoded",
        ),
    ]


def accepted_forms() -> list[tuple[str, str]]:
    """(URL, what /readyz says): parsed, then refused by the server or unreachable."""
    return [
        (f"postgresql://app:{ENCODED}@127.0.0.1:{{port}}/postgres", AUTH_FAILED),
        (f"postgres://app@127.0.0.1:{{port}}/postgres?password={ENCODED}", AUTH_FAILED),
        (
            f"postgresql://app@127.0.0.1:{{port}}/postgres?sslpassword={ENCODED}&password={ENCODED}",
            AUTH_FAILED,
        ),
        (f"POSTGRESQL://app:{ENCODED}@127.0.0.1:{{port}}/postgres", AUTH_FAILED),
        (
            f"postgresql://app:{ENCODED}@[::1]:9,127.0.0.1:9/postgres?connect_timeout=2",
            "unreachable: no connection to the server",
        ),
    ]


def not_ready_until_logged(readyz: str, log_text: Callable[[], str], says: str) -> str:
    """Wait for /readyz to say ``says`` and for two logged attempts; what /readyz said."""
    wait_for(
        lambda: http_get(readyz) == (503, f"database not ready: {says}\n"),
        timeout=30,
        what=f"/readyz to say {says}",
    )
    wait_for(
        lambda: log_text().count("database_not_ready") >= 2,
        timeout=30,
        what="two logged attempts",
    )
    return http_get(readyz)[1]


def run(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDLOCK_")}
    return subprocess.run(
        [SCHEDLOCK, *args],
        env={**env, "SCHEDLOCK_DATABASE_URL": url, "SCHEDLOCK_TARGET": "demo"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("command", [["status"], ["migrate"], ["sidecar"], ["operator"]])
@pytest.mark.parametrize(("form", "says"), refused_forms())
def test_a_url_refused_at_start_is_one_line_without_the_password(
    checking_server: PostgresServer, command: list[str], form: str, says: str
) -> None:
    url, says = (
        form.replace("{port}", str(checking_server.port)),
        says.replace("{port}", str(checking_server.port)),
    )
    result = run(*command, url=url)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], result.stderr
    assert lines[0].startswith(
        f"schedlock {command[0]}: error: --database-url / SCHEDLOCK_DATABASE_URL: "
    )
    assert not leaks(result.stdout + result.stderr)


@pytest.mark.parametrize("command", [["status"], ["migrate"]])
@pytest.mark.parametrize(("form", "says"), accepted_forms())
def test_the_cli_says_why_it_cannot_connect_without_the_password(
    checking_server: PostgresServer, command: list[str], form: str, says: str
) -> None:
    result = run(*command, url=form.replace("{port}", str(checking_server.port)))
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"schedlock {command[0]}: error: cannot"), lines
    expected = "password authentication failed" if says == AUTH_FAILED else "failed"
    assert expected in lines[0], lines[0]
    assert not leaks(result.stdout + result.stderr)


@pytest.mark.parametrize("log_format", ["json", "text"])
@pytest.mark.parametrize(("form", "says"), accepted_forms())
def test_a_sidecar_says_why_in_words_and_logs_no_password(
    tmp_path: Path, checking_server: PostgresServer, form: str, says: str, log_format: str
) -> None:
    url = form.replace("{port}", str(checking_server.port))
    sidecar = SidecarProcess.for_stand_in_app(
        "secretive", tmp_path, url, SCHEDLOCK_LOG_FORMAT=log_format, SCHEDLOCK_MIGRATE="off"
    ).start()
    try:
        # the detail is in the log: at least two attempts, the server's own words
        readyz = not_ready_until_logged(sidecar.url("/readyz"), sidecar.log_text, says)
        assert sidecar.alive()
    finally:
        sidecar.stop()
    log = sidecar.log_text()
    if says == AUTH_FAILED:
        assert "password authentication failed for user" in log
    assert not leaks(log + readyz), leaks(log + readyz)


@pytest.mark.parametrize(("form", "says"), accepted_forms())
def test_an_operator_says_why_before_it_needs_kubernetes(
    tmp_path: Path, checking_server: PostgresServer, form: str, says: str
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("not used: the database is never usable\n")
    operator = OperatorProcess(
        tmp_path / "operator",
        form.replace("{port}", str(checking_server.port)),
        kubeconfig,
        extra_env=RUNTIME_ENV,
    ).start()
    readyz = f"http://127.0.0.1:{operator.health_port}/readyz"
    try:
        said = not_ready_until_logged(readyz, operator.log_text, says)
        assert operator.alive()
    finally:
        operator.stop()
    assert not leaks(operator.log_text() + said), leaks(operator.log_text() + said)
