"""Executing the plan: each fault does its damage, holds, heals, and leaves a record.

A record says exactly what was done and when (``time.time()``, the clock the receiver stamps
arrivals with): the victim, the lock keys it led at that moment (the terms the fault can end),
and when the fault was healed.  Records go to ``faults.jsonl`` as they complete.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

import psycopg

from chaos.config import ChaosConfig
from chaos.plan import (
    APP_5XX,
    APP_HANG,
    APP_SLOW,
    FAILOVER_ASYNC,
    FAILOVER_SYNC,
    KILL,
    OPERATOR_KILL,
    PARTITION,
    PG_RESTART,
    SIGTERM,
    STOP,
    TERMINATE,
    PlannedFault,
)
from chaos.stack import DATABASE, STANDBY_NAME, ChaosPostgres, Replica, Stack, log
from schedlock.store import LockKey


@dataclass
class FaultRecord:
    kind: str
    lane: str
    planned_at: float
    start: float = 0.0
    end: float = 0.0
    target: str = ""
    scheduler: str = ""
    victim: str | None = None
    keys: list[str] = field(default_factory=list)  # lock keys whose terms the fault can end
    detail: dict[str, Any] = field(default_factory=dict)
    skipped: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class FaultRunner:
    def __init__(self, stack: Stack, config: ChaosConfig, t0: float, path: Path) -> None:
        self.stack = stack
        self.config = config
        self.t0 = t0
        self.records: list[FaultRecord] = []
        self._file: TextIO = path.open("a", buffering=1)
        self.restarts: list[dict[str, Any]] = []  # sidecars found dead that no fault killed

    def close(self) -> None:
        self._file.close()

    def _save(self, record: FaultRecord) -> None:
        self.records.append(record)
        self._file.write(json.dumps(record.to_json()) + "\n")
        rel = record.start - self.t0 if record.start else 0.0
        if record.skipped:
            log(f"  fault {record.kind:15} skipped: {record.skipped}")
        else:
            who = f" {record.victim}" if record.victim else f" {record.target}"
            keys = f" keys={','.join(record.keys)}" if record.keys else ""
            log(
                f"  fault {record.kind:15} t+{rel:6.1f}s held {record.end - record.start:5.2f}s"
                f"{who}{keys} {record.detail or ''}"
            )

    async def run_lane(self, lane: str, plan: list[PlannedFault], stop_at: float) -> None:
        for planned in plan:
            delay = self.t0 + planned.at - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
            record = FaultRecord(planned.kind, lane, planned.at, target=planned.target)
            if time.time() + planned.hold > stop_at:
                record.skipped = "would not heal before the quiet tail"
                self._save(record)
                continue
            try:
                await self.execute(planned, record)
            except (OSError, psycopg.Error, RuntimeError, TimeoutError) as exc:
                record.detail["error"] = f"{type(exc).__name__}: {exc}"
                if not record.end:
                    record.end = time.time()
            self._save(record)

    async def execute(self, p: PlannedFault, r: FaultRecord) -> None:
        if p.kind in (APP_5XX, APP_HANG, APP_SLOW):
            await self._app(p, r)
        elif p.kind == PG_RESTART:
            await self._pg_restart(p, r)
        elif p.kind == OPERATOR_KILL:
            await self._operator_kill(p, r)
        elif p.kind in (FAILOVER_SYNC, FAILOVER_ASYNC):
            await self._failover(p, r)
        else:
            await self._leader_fault(p, r)

    # -- the app ------------------------------------------------------------------------------

    async def _app(self, p: PlannedFault, r: FaultRecord) -> None:
        # A hung request is logged by the receiver with the status it would have answered:
        # 504 marks it as an attempt that got no answer (the sidecar times out).
        bad: dict[str, Any] = {"status": 503}
        if p.kind == APP_HANG:
            bad = {"hang": True, "status": 504}
        elif p.kind == APP_SLOW:
            bad = {"delay": p.pick}
        if p.kind == APP_SLOW:
            r.detail["delay"] = p.pick
        r.start = time.time()
        await self.stack.control_app(p.target, **bad)
        try:
            await asyncio.sleep(p.hold)
        finally:
            await self.stack.control_app(p.target, status=200, hang=False, delay=0)
            r.end = time.time()

    # -- PostgreSQL -----------------------------------------------------------------------------

    async def _pg_restart(self, p: PlannedFault, r: FaultRecord) -> None:
        r.target = ""
        r.keys = sorted(str(k) for k in self.stack.keys)
        r.detail["mode"] = p.variant
        r.start = time.time()
        await self.stack.pg.astop(p.variant)
        r.detail["down_at"] = round(time.time() - r.start, 3)
        await asyncio.sleep(p.hold)
        await self.stack.pg.astart()
        r.end = time.time()

    # -- fail-over to the standby ---------------------------------------------------------------

    async def _failover(self, p: PlannedFault, r: FaultRecord) -> None:
        """Kill the primary and promote the standby, with synchronous replication (nothing
        acknowledged is lost) or asynchronous with replication cut for ``hold`` seconds first
        (what the primary commits meanwhile is lost).  The old primary then comes back
        read-only for a while (nobody may lead on it) and is rebuilt as the new standby."""
        stack = self.stack
        old, new = stack.pg, stack.standby
        r.target = ""
        r.keys = sorted(str(k) for k in stack.keys)
        r.detail["from_port"], r.detail["to_port"] = old.port, new.port
        if p.kind == FAILOVER_SYNC:
            await _alter_system(old, f"synchronous_standby_names = '{STANDBY_NAME}'")
            try:
                await _wait_sync(old)
            except TimeoutError:
                await _alter_system(old, "synchronous_standby_names = ''")  # commits go on
                raise
            r.start = time.time()
            await old.astop("immediate")
            await asyncio.sleep(p.hold)
        else:
            assert stack.replication is not None
            r.start = time.time()
            stack.replication.blackhole()
            await asyncio.sleep(p.hold)
            r.detail["killed_at"] = time.time()
            await old.astop("immediate")
        r.detail["down_at"] = round(time.time() - r.start, 3)
        await asyncio.to_thread(new.promote)
        stack.promote_standby()
        if p.kind == FAILOVER_SYNC:
            await _alter_system(new, "synchronous_standby_names = ''")
        r.end = time.time()
        r.detail["promoted_after"] = round(r.end - r.start, 3)
        # The old primary back, read-only: sidecars (multi-host URL) must skip it.
        old.settings = {**stack.base_settings, "default_transaction_read_only": "on"}
        await old.astart()
        locks = 0
        for _ in range(10):
            await asyncio.sleep(0.3)
            locks = max(locks, await _advisory_locks(old))
        r.detail["read_only_advisory_locks"] = locks
        started = time.time()
        await stack.start_standby()
        r.detail["standby_rebuilt_in"] = round(time.time() - started, 2)

    # -- the operator ---------------------------------------------------------------------------

    async def _operator_kill(self, p: PlannedFault, r: FaultRecord) -> None:
        operator = self.stack.operator
        if operator is None or not operator.alive():
            r.skipped = "operator not running"
            return
        r.target = ""
        r.victim = "operator"
        r.start = time.time()
        operator.kill()
        await asyncio.sleep(p.hold)
        operator.spawn()
        r.end = time.time()
        http = await self.stack.open_http()
        healthy = await operator.wait_healthy(http)
        r.detail["healthy_after"] = round(time.time() - r.end, 2) if healthy else None

    # -- faults aimed at the leader of a key ------------------------------------------------------

    async def _victim(self, p: PlannedFault, r: FaultRecord) -> Replica | None:
        r.scheduler = p.scheduler
        name: str | None = None
        if p.kind == PARTITION and p.variant == "any":
            candidates = sorted(
                n
                for n, rep in self.stack.replicas.items()
                if rep.target == p.target and not rep.down and rep.process.alive()
            )
            if candidates:
                name = candidates[int(p.pick * len(candidates))]
        else:
            name = await self.stack.leader_of(p.target, p.scheduler)
        if name is None:
            r.skipped = f"no live leader of {p.scheduler}/{p.target}"
            return None
        r.victim = name
        r.keys = await self.stack.keys_led_by(name)
        planned = f"{p.scheduler}/{self.config.namespace}/{p.target}"
        if p.variant != "any" and planned not in r.keys:
            r.keys.append(planned)  # it led it a moment ago (lost it since, or racing)
        return self.stack.replicas[name]

    async def _leader_fault(self, p: PlannedFault, r: FaultRecord) -> None:
        victim = await self._victim(p, r)
        if victim is None:
            return
        proc = victim.process
        if p.kind == KILL:
            victim.down = True
            r.start = time.time()
            proc.signal(signal.SIGKILL)
            assert proc.process is not None
            await _wait_exit(proc.process, 10)
            await asyncio.sleep(p.hold)
            proc.start()
            victim.down = False
            r.end = time.time()
        elif p.kind == STOP:
            r.detail["variant"] = p.variant or "past-lease"
            victim.frozen = True
            r.start = time.time()
            proc.signal(signal.SIGSTOP)
            try:
                await asyncio.sleep(p.hold)
            finally:
                proc.signal(signal.SIGCONT)
                victim.frozen = False
                r.end = time.time()
        elif p.kind == PARTITION:
            r.detail["variant"] = p.variant
            direction = p.variant if p.variant in ("to_server", "to_client") else "both"
            r.start = time.time()
            victim.proxy.blackhole(direction)
            try:
                await asyncio.sleep(p.hold)
            finally:
                victim.proxy.heal()
                r.end = time.time()
        elif p.kind == TERMINATE:
            await self._terminate(p, r, victim)
        elif p.kind == SIGTERM:
            victim.down = True
            r.start = time.time()
            proc.signal(signal.SIGTERM)
            assert proc.process is not None
            code = await _wait_exit(proc.process, self.config.shutdown_grace_seconds + 15)
            r.detail["exit_code"] = code
            r.detail["exited_after"] = round(time.time() - r.start, 3)
            await asyncio.sleep(p.hold)
            proc.start()
            victim.down = False
            r.end = time.time()
        else:
            raise ValueError(p.kind)

    async def _terminate(self, p: PlannedFault, r: FaultRecord, victim: Replica) -> None:
        """pg_terminate_backend of the lock session of one key, or of every lock session of
        the victim (its application_name is its holder name)."""
        r.detail["variant"] = p.variant
        if p.variant == "lock":
            # A sidecar's one lock session (named as the sidecar) holds all its keys' locks.
            key = LockKey(p.scheduler, self.config.namespace, p.target)
            leads = (await self.stack.leaders()).get(key) == victim.name
            r.keys = [str(key)] if leads else []
            pattern = victim.name
        else:
            # "holder": its lock sessions; "all": its LISTEN connection (and any probe) too.
            leads = True
            pattern = victim.name if p.variant == "holder" else f"{victim.name}-%"
        rows = await self.stack.query(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND (application_name = %s OR application_name LIKE %s)",
            (victim.name, pattern),
        )
        pids = [int(row[0]) for row in rows] if leads else []
        r.start = time.time()
        done = [
            bool((await self.stack.query("SELECT pg_terminate_backend(%s)", (pid,)))[0][0])
            for pid in pids
        ]
        r.end = time.time()
        r.detail["backends"] = len(pids)
        r.detail["terminated"] = sum(done)


async def _alter_system(server: ChaosPostgres, setting: str) -> None:
    async with await psycopg.AsyncConnection.connect(
        server.url(), autocommit=True, connect_timeout=3
    ) as conn:
        await conn.execute(f"ALTER SYSTEM SET {setting}")
        await conn.execute("SELECT pg_reload_conf()")


async def _wait_sync(server: ChaosPostgres, timeout: float = 10) -> None:
    """Until the primary reports its standby synchronous."""
    deadline = time.monotonic() + timeout
    async with await psycopg.AsyncConnection.connect(
        server.url(), autocommit=True, connect_timeout=3
    ) as conn:
        while True:
            cur = await conn.execute(
                "SELECT count(*) FROM pg_stat_replication "
                "WHERE application_name = %s AND sync_state = 'sync'",
                (STANDBY_NAME,),
            )
            row = await cur.fetchone()
            if row is not None and row[0] == 1:
                return
            if time.monotonic() > deadline:
                raise TimeoutError("the standby did not become synchronous")
            await asyncio.sleep(0.05)


async def _advisory_locks(server: ChaosPostgres) -> int:
    """Advisory locks granted on ``server`` (leaders, standby places: a read-only server must
    have none)."""
    async with await psycopg.AsyncConnection.connect(
        server.url(DATABASE), autocommit=True, connect_timeout=3
    ) as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        row = await cur.fetchone()
        return int(row[0]) if row else 0


async def _wait_exit(process: Any, timeout: float) -> int | None:
    deadline = time.monotonic() + timeout
    while process.poll() is None:
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            return None
        await asyncio.sleep(0.02)
    code: int = process.returncode
    return code
