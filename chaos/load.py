"""The work: one-shot rows (direct inserts and ScheduledPublish objects) and "@every 1s" schedules.

Direct rows are written the way any writer may write them (one INSERT per batch, uids
``cli-chaos-N`` like ``schedlock publish`` makes, so the operator's status sync skips them).
Objects go through the real API server; the operator turns them into rows.  Every uid the
harness knows was stored (the INSERT returned, or the API answered 201) is appended to
``expected.jsonl`` at once: that file, not the database, is what the checker expects.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TextIO

import aiohttp
import psycopg

from chaos.config import ChaosConfig
from chaos.stack import Stack, log
from schedlock.core.identities import CLI_UID_PREFIX, rfc3339
from schedlock.operator import crd
from schedlock.store import ScheduleSpec, open_store

TICK = 0.5
SP_API = f"/apis/{crd.GROUP}/{crd.VERSION}/namespaces/{{ns}}/{crd.PLURAL}"

INSERT_ROWS = """
INSERT INTO schedlock_publishes (scheduler, namespace, name, uid, target, due_at,
    next_attempt_at, payload, max_attempts, backoff_seconds, starting_deadline_seconds)
SELECT 'publish', %(ns)s, v.uid, v.uid, v.target,
       now() + make_interval(secs => v.offset_s), now() + make_interval(secs => v.offset_s),
       jsonb_build_object('chaos', v.uid), %(attempts)s, %(backoff)s, NULL
FROM unnest(%(uids)s::text[], %(targets)s::text[], %(offsets)s::float8[])
     AS v(uid, target, offset_s)
ON CONFLICT (uid) DO NOTHING
"""


class Expected:
    """Append-only record of what the harness stored and so expects to be delivered."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: TextIO = path.open("a", buffering=1)
        self.count = 0

    def add(self, kind: str, uid: str, target: str, due: float | None) -> None:
        entry = {"kind": kind, "uid": uid, "target": target, "due": due, "stored": time.time()}
        self._file.write(json.dumps(entry))
        self._file.write("\n")
        self.count += 1

    def close(self) -> None:
        self._file.close()


async def create_schedules(stack: Stack, config: ChaosConfig) -> list[dict[str, Any]]:
    store = open_store(stack.admin_url, application_name="chaos-schedules")
    made = []
    for target in config.targets:
        for i in range(config.schedules_per_target):
            uid = f"{CLI_UID_PREFIX}chaos-every-{target}-{i}"
            await store.upsert_schedule(
                ScheduleSpec(
                    namespace=config.namespace,
                    name=f"every-{target}-{i}",
                    uid=uid,
                    target=target,
                    expression="@every 1s",
                    payload={"schedule": uid},
                    max_attempts=config.row_max_attempts,
                    backoff_seconds=config.row_backoff_seconds,
                    starting_deadline_seconds=config.slot_deadline_seconds,
                )
            )
            made.append({"uid": uid, "target": target})
    await store.close()
    return made


class _Load:
    """One stream of one-shot rows, with its own random stream (``stream``) of the seed."""

    stream = 0

    def __init__(self, stack: Stack, config: ChaosConfig, expected: Expected) -> None:
        self.stack = stack
        self.config = config
        self.expected = expected
        self.rng = random.Random(config.seed * 7919 + self.stream)
        self.seq = 0
        self.failures = 0


class DirectRows(_Load):
    """~rows_per_second x (1 - operator_share) rows a second, inserted in small batches."""

    stream = 1
    _conn: psycopg.AsyncConnection[Any] | None = None

    async def _connection(self) -> psycopg.AsyncConnection[Any]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = await psycopg.AsyncConnection.connect(
                self.stack.admin_url, autocommit=True, connect_timeout=2, application_name="rows"
            )
        return self._conn

    async def run(self, until: float) -> None:
        rate = self.config.rows_per_second * (1 - self.config.operator_share)
        owed = 0.0
        pending: list[tuple[str, str, float]] = []
        next_tick = time.monotonic()
        while time.time() < until:
            owed += rate * TICK
            while owed >= 1:
                owed -= 1
                self.seq += 1
                # Due from "already late" to a few seconds ahead, as real writers produce.
                offset = self.rng.uniform(-0.5, 4.0)
                # Never due after the end of the load: every row can settle in the drain.
                offset = min(offset, until - time.time())
                target = self.rng.choice(self.config.targets)
                pending.append((f"{CLI_UID_PREFIX}chaos-{self.seq}", target, offset))
            if pending and await self._insert(pending):
                pending = []
            next_tick += TICK
            await asyncio.sleep(max(0.0, next_tick - time.monotonic()))
        if pending:
            for _ in range(20):
                if await self._insert(pending):
                    break
                await asyncio.sleep(1)
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close()

    async def _insert(self, batch: list[tuple[str, str, float]]) -> bool:
        try:
            conn = await self._connection()
            await conn.execute(
                INSERT_ROWS,
                {
                    "ns": self.config.namespace,
                    "uids": [b[0] for b in batch],
                    "targets": [b[1] for b in batch],
                    "offsets": [b[2] for b in batch],
                    "attempts": self.config.row_max_attempts,
                    "backoff": self.config.row_backoff_seconds,
                },
            )
        except psycopg.Error:
            # The database is down (a fault): keep the batch; ON CONFLICT makes a re-send of
            # a batch that did commit harmless.
            self.failures += 1
            if self._conn is not None:
                with contextlib.suppress(Exception):
                    await self._conn.close()
            self._conn = None
            return False
        for uid, target, _ in batch:
            self.expected.add("row", uid, target, None)
        return True


class ObjectRows(_Load):
    """The operator's share: ScheduledPublish objects created through the API server."""

    stream = 2

    async def run(self, until: float) -> None:
        rate = self.config.rows_per_second * self.config.operator_share
        if rate <= 0:
            return
        path = SP_API.format(ns=self.config.namespace)
        while time.time() < until:
            await asyncio.sleep(self.rng.expovariate(rate))
            lead = self.rng.uniform(2.0, 6.0)
            if time.time() + lead > until:
                continue
            self.seq += 1
            name = f"sp-{self.seq}"
            target = self.rng.choice(self.config.targets)
            at = datetime.now(UTC) + timedelta(seconds=lead)
            body = {
                "apiVersion": f"{crd.GROUP}/{crd.VERSION}",
                "kind": crd.KIND,
                "metadata": {"name": name},
                "spec": {
                    "target": target,
                    "publishAt": rfc3339(at, "microseconds"),
                    "payload": {"chaos": name},
                    "retry": {
                        "maxAttempts": self.config.object_max_attempts,
                        "backoffSeconds": self.config.object_backoff_seconds,
                    },
                },
            }
            uid = await self._create(path, name, body)
            if uid is not None:
                self.expected.add("object", uid, target, at.timestamp())

    async def _create(self, path: str, name: str, body: dict[str, Any]) -> str | None:
        for _ in range(5):
            try:
                status, data = await self.stack.kube_request("POST", path, body)
                if status == 201:
                    return str(data["metadata"]["uid"])
                if status == 409:  # an earlier try did create it
                    status, data = await self.stack.kube_request("GET", f"{path}/{name}")
                    if status == 200:
                        return str(data["metadata"]["uid"])
                log(f"create {name}: HTTP {status}: {data.get('message')}")
            except (aiohttp.ClientError, TimeoutError) as exc:
                log(f"create {name}: {exc!r}")
            self.failures += 1
            await asyncio.sleep(0.5)
        return None
