"""One sample of the soak: tables, sessions, memory and the lateness of the window's fires.

Each value is one point of a named series (``kind/what``, the kinds of :mod:`bench.soak.trends`):

* ``table_mb/<table>``, ``live_rows/<table>``, ``dead_rows/<table>`` — ``pg_total_relation_size``
  (heap, indexes and TOAST) and ``n_live_tup``/``n_dead_tup`` of ``pg_stat_user_tables``;
* ``sessions/total`` and ``sessions/<application_name>`` — client backends of the soak's
  database in ``pg_stat_activity``, but the harness's own (``soak-…``);
* ``rss_mb/<process>`` — ``VmRSS`` of each product process; ``rss_mb/postgres`` the private
  memory (``RssAnon``) of the postmaster and all its children (their ``VmRSS`` would count the
  shared buffers once per backend that touched them); ``harness_rss_mb/<process>`` the
  recording app, etcd and kube-apiserver;
* ``lateness_ms/p50|p99``, ``lateness_max_ms`` and ``fires_per_s`` of the deliveries that arrived
  in the window (arrival at the app minus the due time).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import psycopg

from bench.soak.trends import lateness_window
from testbed.deliveries import DeliveryLog
from testbed.procs import children, status_kb

HARNESS_PROCESSES = ("receiver", "etcd", "kube-apiserver")

TABLES = """
SELECT relname, pg_total_relation_size(relid), n_live_tup, n_dead_tup
FROM pg_stat_user_tables ORDER BY relname
"""
SESSIONS = """
SELECT application_name, count(*) FROM pg_stat_activity
WHERE datname = current_database() AND backend_type = 'client backend'
  AND application_name NOT LIKE 'soak-%%'
GROUP BY application_name
"""


def memory(processes: dict[str, int], postmaster: int | None) -> dict[str, float]:
    values: dict[str, float] = {}
    for name, pid in processes.items():
        rss = status_kb(pid).get("VmRSS")
        if rss is not None:
            kind = "harness_rss_mb" if name in HARNESS_PROCESSES else "rss_mb"
            values[f"{kind}/{name}"] = rss / 1024
    if postmaster is not None:
        private = sum(
            status_kb(pid).get("RssAnon", 0) for pid in [postmaster, *children(postmaster)]
        )
        values["rss_mb/postgres"] = private / 1024
    return values


class Sampler:
    """Reads the database on one connection of its own (``soak-sampler``) and the app's log
    from where it stopped last time."""

    def __init__(self, admin_url: str, deliveries: Path) -> None:
        self.admin_url = admin_url
        self.log = DeliveryLog(deliveries)
        self.conn: psycopg.Connection[Any] | None = None

    def _connection(self) -> psycopg.Connection[Any]:
        if self.conn is None or self.conn.closed or self.conn.broken:
            self.conn = psycopg.connect(
                self.admin_url, autocommit=True, application_name="soak-sampler"
            )
        return self.conn

    def database(self) -> dict[str, float]:
        values: dict[str, float] = {}
        conn = self._connection()
        for table, size, live, dead in conn.execute(TABLES).fetchall():
            values[f"table_mb/{table}"] = int(size) / 2**20
            values[f"live_rows/{table}"] = float(live)
            values[f"dead_rows/{table}"] = float(dead)
        total = 0
        for application, count in conn.execute(SESSIONS).fetchall():
            values[f"sessions/{application or '(none)'}"] = float(count)
            total += int(count)
        values["sessions/total"] = float(total)
        return values

    def lateness(self, window_s: float) -> dict[str, float]:
        late = [
            d.late_seconds * 1000 for d in self.log.appended() if d.scheduled is not None and d.ok
        ]
        return lateness_window(late, window_s)

    def sample(
        self, window_s: float, processes: dict[str, int], postmaster: int | None
    ) -> dict[str, float]:
        values = {**self.database(), **memory(processes, postmaster), **self.lateness(window_s)}
        return {k: v for k, v in values.items() if not math.isnan(v)}

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
