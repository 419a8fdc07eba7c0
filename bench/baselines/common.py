"""What both baselines share: reading due rows, delivering them, recording the outcome.

The baselines fire the same ``schedlock_publishes`` rows as schedlock and POST the same JSON
body to the same recording app, so the receiver measures all three systems alike.  They are
deliberately plain — what a team would write around each election mechanism — and fire one
row at a time over one keep-alive HTTP connection.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import urllib3

from schedlock.core.identities import rfc3339

DUE_ROWS = """
SELECT id, uid, namespace, name, target, due_at, payload, attempts
FROM schedlock_publishes
WHERE scheduler = 'publish' AND namespace = %s AND target = %s
  AND state = 'scheduled' AND next_attempt_at <= now()
ORDER BY next_attempt_at, id
LIMIT %s
"""

MARK = """
UPDATE schedlock_publishes
SET state = CASE WHEN %(ok)s THEN 'published' ELSE 'scheduled' END,
    attempts = attempts + 1, holder = %(holder)s, last_status = %(status)s,
    fired_at = now(), finished_at = CASE WHEN %(ok)s THEN now() END, updated_at = now()
WHERE id = %(id)s
"""


def common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--name", required=True, help="replica name (holder, application_name)")
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--target-url", required=True)
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--target", default="demo")
    parser.add_argument("--status-file", type=Path, required=True)


class Firer:
    """Delivers rows one by one and records each outcome on the connection it is given."""

    def __init__(self, holder: str, target_url: str) -> None:
        self.holder = holder
        self.target_url = target_url
        self.http = urllib3.PoolManager(maxsize=1, retries=False, timeout=10.0)
        self.fires = 0

    def due(
        self, conn: psycopg.Connection[Any], namespace: str, target: str, limit: int
    ) -> list[Any]:
        return conn.execute(DUE_ROWS, (namespace, target, limit)).fetchall()

    def fire(self, conn: psycopg.Connection[Any], row: tuple[Any, ...]) -> None:
        row_id, uid, namespace, name, target, due_at, payload, attempts = row
        scheduled = rfc3339(due_at)
        body = {
            "id": row_id,
            "uid": uid,
            "namespace": namespace,
            "name": name,
            "target": target,
            "scheduledAt": scheduled,
            "attempt": attempts + 1,
            "term": None,
            "holder": self.holder,
            "payload": payload,
        }
        try:
            response = self.http.request(
                "POST",
                self.target_url,
                body=json.dumps(body, separators=(",", ":")).encode(),
                headers={
                    "Content-Type": "application/json",
                    "Idempotency-Key": f"{uid}/{scheduled}",
                },
            )
            status: int | None = response.status
        except urllib3.exceptions.HTTPError:
            status = None
        ok = status is not None and 200 <= status < 300
        conn.execute(MARK, {"ok": ok, "holder": self.holder, "status": status, "id": row_id})
        self.fires += 1


class Status:
    """A small JSON file the harness reads: ready, leading, API calls made, rows fired."""

    def __init__(self, path: Path, name: str) -> None:
        self.path = path
        self.values: dict[str, Any] = {"name": name, "pid": os.getpid(), "ready": False}
        self.lock = threading.Lock()

    def update(self, **values: Any) -> None:
        with self.lock:
            self.values.update(values)
            tmp = self.path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(self.values))
            tmp.replace(self.path)


def exit_on_sigterm() -> None:
    """The baselines have no graceful hand-over: SIGTERM ends the process (its connections
    close, so a seed replica that holds the lock mid-tick frees it)."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))


def sleep_until(deadline: float) -> None:
    delay = deadline - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def start(
    description: str | None,
    add_arguments: Callable[[argparse.ArgumentParser], None],
    log_level: int,
) -> tuple[argparse.Namespace, Status]:
    """A baseline worker's start: its flags (the common ones first), logging, SIGTERM, status."""
    parser = argparse.ArgumentParser(description=description)
    common_arguments(parser)
    add_arguments(parser)
    args = parser.parse_args()
    logging.basicConfig(level=log_level, format="%(asctime)s %(name)s %(message)s")
    exit_on_sigterm()
    return args, Status(args.status_file, args.name)
