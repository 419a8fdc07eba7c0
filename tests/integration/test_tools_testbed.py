"""The pinned tools run: helm lints and renders the chart, promtool answers, PgBouncer pools."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import psycopg
import yaml

from testbed.pg import PgBouncer
from testbed.pg_fixtures import PostgresService

CHART = Path(__file__).resolve().parents[2] / "charts" / "schedlock"


def run(*argv: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in argv], check=False, capture_output=True, text=True)


def test_helm_lint_and_template(helm_bin: Path) -> None:
    lint = run(helm_bin, "lint", "--strict", CHART)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    rendered = run(helm_bin, "template", "demo", CHART, "--namespace", "schedlock")
    assert rendered.returncode == 0, rendered.stderr
    docs = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    assert docs, "helm template rendered nothing"
    for doc in docs:
        assert doc["metadata"]["labels"]["app.kubernetes.io/instance"] == "demo"


def test_promtool_runs(promtool_bin: Path) -> None:
    version = run(promtool_bin, "--version")
    assert version.returncode == 0, version.stderr
    assert "promtool" in (version.stdout + version.stderr)


def test_pgbouncer_in_transaction_mode(
    postgres: PostgresService, database: str, pgbouncer_factory: Callable[[str], PgBouncer]
) -> None:
    bouncer = pgbouncer_factory("transaction")
    dbname = database.rsplit("/", 1)[1]
    with psycopg.connect(bouncer.url(dbname), autocommit=True, prepare_threshold=None) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
