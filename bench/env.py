"""The benchmark's test bed: one PostgreSQL (with pg_stat_statements), one kube-apiserver.

Each system under test gets its own database cloned from a migrated template, so rows, locks
and statistics never mix; replicas that must be told apart in PostgreSQL's own statistics
connect as their own role (``pg_stat_statements`` counts calls per role and database).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

from testbed.kube import KubeAPIServer
from testbed.pg import PostgresServer, start_guard

TEMPLATE = "bench_template"


class BenchEnv:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.pg = PostgresServer(
            workdir / "postgres",
            settings={
                "shared_preload_libraries": "pg_stat_statements",
                "pg_stat_statements.track": "top",
                "pg_stat_statements.max": "10000",
                # PostgreSQL's default: schedlock must fit beside the app whatever the replica
                # count (the scale scenario measures it against the old design).
                "max_connections": "100",
            },
        )
        self.kube: KubeAPIServer | None = None
        self._admin: psycopg.Connection[tuple[Any, ...]] | None = None
        self._guard: subprocess.Popen[bytes] | None = None
        self._roles: set[str] = set()
        self._counter = itertools.count()
        self.started = False

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        self.pg.start()
        assert self.pg.process is not None
        # The server guards its own data; this guard removes the run's directory as well.
        self._guard = start_guard(self.pg.process.pid, self.workdir)
        self.started = True
        self.sql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        self.sql(f'CREATE DATABASE "{TEMPLATE}"')
        subprocess.run(
            [str(Path(sys.executable).parent / "schedlock"), "migrate"],
            env={**os.environ, "SCHEDLOCK_DATABASE_URL": self.pg.url(TEMPLATE)},
            check=True,
            capture_output=True,
        )

    def start_kube(self) -> KubeAPIServer:
        if self.kube is None:
            kube = KubeAPIServer(self.workdir / "kube")
            kube.start()
            self.kube = kube
        return self.kube

    def close(self) -> None:
        if self.kube is not None:
            self.kube.stop()
            self.kube = None
        if self._admin is not None:
            with contextlib.suppress(psycopg.Error):
                self._admin.close()
            self._admin = None
        if self.started:
            self.pg.destroy()
            self.started = False
        if self._guard is not None:
            self._guard.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._guard.wait(5)
            self._guard = None

    # -- databases and roles ----------------------------------------------------------------

    @property
    def admin(self) -> psycopg.Connection[tuple[Any, ...]]:
        if self._admin is None or self._admin.closed:
            self._admin = psycopg.connect(self.pg.url(), autocommit=True)
        return self._admin

    def sql(self, query: str, params: tuple[Any, ...] | None = None) -> list[tuple[Any, ...]]:
        cur = self.admin.execute(query.encode(), params)
        return cur.fetchall() if cur.description else []

    def new_database(self, label: str) -> str:
        """A fresh database with the current schedlock schema; returns its name."""
        name = f"b{next(self._counter)}_{label}"[:63]
        self.sql(f'CREATE DATABASE "{name}" TEMPLATE "{TEMPLATE}" STRATEGY FILE_COPY')
        return name

    def ensure_role(self, role: str) -> None:
        """A login role (superuser: the bench measures, it does not test privileges)."""
        if role in self._roles:
            return
        self.sql(
            f'DO $$ BEGIN CREATE ROLE "{role}" LOGIN SUPERUSER; '
            "EXCEPTION WHEN duplicate_object THEN NULL; END $$"
        )
        self._roles.add(role)

    def url(self, dbname: str, role: str | None = None) -> str:
        if role is None:
            return self.pg.url(dbname)
        self.ensure_role(role)
        return self.pg.url(dbname, user=role)

    def database_oid(self, dbname: str) -> int:
        return int(self.sql("SELECT oid FROM pg_database WHERE datname = %s", (dbname,))[0][0])

    def server_version(self) -> str:
        return str(self.sql("SHOW server_version")[0][0])

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(psycopg.Error):
                self.sql("SELECT 1")
                return
            time.sleep(0.1)
        raise TimeoutError("postgres did not answer")
