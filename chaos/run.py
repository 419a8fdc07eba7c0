"""One chaos run: set up, warm up, load + faults for ``duration`` seconds, drain, tear down, judge.

Timeline (t = 0 when the load starts)::

    set-up ~30 s | load + faults ........................ | quiet tail | drain | teardown
                 0                          duration - 20 s   duration   <= 60 s

Faults never start so late that they would not heal before the quiet tail; rows are never due
after ``duration``; the drain waits until every expected row and every slot up to the end of
the load is finished in the database (published, failed, missed) or the drain times out.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import signal
import sys
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

import psycopg

from chaos import checker
from chaos.config import ChaosConfig
from chaos.faults import FaultRunner
from chaos.load import SP_API, DirectRows, Expected, ObjectRows, create_schedules
from chaos.plan import APP_KINDS, plan_faults
from chaos.stack import Stack, log
from schedlock.store import PublishRecord, StoreError, SweepPosition, open_store

TERMINAL = ("published", "failed", "missed", "cancelled")
DUMP_PAGE = 1000  # rows per page of the final dump


class HarnessError(RuntimeError):
    """The run could not be carried out (a process did not start, ...): no verdict."""


def _interrupt(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def run(config: ChaosConfig, rundir: Path, verdict_path: Path, keep: bool) -> int:
    started = time.monotonic()
    rundir.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, _interrupt)
    print(
        f"chaos: seed {config.seed} (replay: python -m chaos --seed {config.seed} "
        f"--duration {config.duration:g})",
        flush=True,
    )
    log(f"run directory {rundir}")
    stack = Stack(config, rundir)
    run_info: dict[str, Any] = {"config": config.to_json()}
    plan = plan_faults(config)
    (rundir / "plan.json").write_text(json.dumps([p.to_json() for p in plan], indent=1))
    try:
        log("starting PostgreSQL")
        stack.start_database()
        kubeconfig = None
        if config.with_operator:
            log("starting kube-apiserver + etcd, installing the CRD")
            kubeconfig = stack.start_kube()
        stack.start_receivers()
        asyncio.run(_main(config, rundir, stack, plan, kubeconfig, run_info))
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    except HarnessError as exc:
        log(f"HARNESS ERROR: {exc}")
        return 2
    except Exception:
        log("HARNESS ERROR:\n" + traceback.format_exc())
        return 2
    finally:
        stack.stop_sync()
        (rundir / "run.json").write_text(json.dumps(run_info, indent=1))
    data = _load(rundir)
    if data is None:
        return 2
    verdict, report = checker.check(data)
    report["logged"] = checker.log_levels(rundir)
    report["wall_seconds"] = round(time.monotonic() - started, 1)
    report["sidecar_exit_codes"] = codes = run_info.get("exit_codes") or {}
    bad_exits = {name: code for name, code in codes.items() if code != 0}
    if bad_exits:
        report["notes"].append(f"sidecars not exiting 0 on the final SIGTERM: {bad_exits}")
    if run_info.get("unexpected_exits"):
        report["notes"].append(f"processes exited on their own: {run_info['unexpected_exits']}")
    report["unexpected_exits"] = run_info.get("unexpected_exits")
    report["load"] = run_info.get("load")
    report["object_phases"] = run_info.get("object_phases")
    report["drain"] = {
        "seconds": run_info.get("drain_seconds"),
        "pending": run_info.get("drain_pending"),
    }
    (rundir / "report.json").write_text(json.dumps(report, indent=1))
    checker.write_verdict(verdict, verdict_path)
    print(checker.summary(verdict, report), flush=True)
    log(f"verdict written to {verdict_path}; details in {rundir / 'report.json'}")
    log(f"wall time {report['wall_seconds']} s for a {config.duration:g} s run")
    if not verdict["expected"] or not verdict["delivered"] or not data.faults:
        log("HARNESS ERROR: nothing was expected, delivered or injected; kept " + str(rundir))
        return 2
    failed = bool(report["violations"])
    if failed or keep:
        log(f"kept {rundir}")
    else:
        shutil.rmtree(rundir, ignore_errors=True)
    return 1 if failed else 0


async def _main(
    config: ChaosConfig,
    rundir: Path,
    stack: Stack,
    plan: list[Any],
    kubeconfig: Path | None,
    run_info: dict[str, Any],
) -> None:
    expected = Expected(rundir / "expected.jsonl")
    runner: FaultRunner | None = None
    try:
        log("starting the standby (pg_basebackup, streaming through the replication proxy)")
        await stack.start_standby()
        log(f"starting {config.replicas} sidecars for each of {', '.join(config.targets)}")
        run_info["schedules"] = {
            s["uid"]: {"target": s["target"]} for s in await create_schedules(stack, config)
        }
        await stack.start_sidecars()
        if kubeconfig is not None:
            stack.start_operator(kubeconfig)
        await _warm_up(stack, config, run_info)

        t0 = time.time()
        t_end = t0 + config.duration
        run_info["t0"], run_info["t_end"] = t0, t_end
        stop_faults = t_end - config.quiet_tail_seconds
        log(f"load and faults for {config.duration:g} s ({len(plan)} faults planned)")
        runner = FaultRunner(stack, config, t0, rundir / "faults.jsonl")
        direct = DirectRows(stack, config, expected)
        objects = ObjectRows(stack, config, expected)
        tasks = [
            asyncio.create_task(direct.run(t_end), name="rows"),
            asyncio.create_task(
                runner.run_lane("infra", [p for p in plan if p.kind not in APP_KINDS], stop_faults),
                name="infra-faults",
            ),
            asyncio.create_task(
                runner.run_lane("app", [p for p in plan if p.kind in APP_KINDS], stop_faults),
                name="app-faults",
            ),
        ]
        if config.with_operator:
            tasks.append(asyncio.create_task(objects.run(t_end), name="objects"))
        watchdog = asyncio.create_task(_watchdog(stack, run_info, t0), name="watchdog")
        progress = asyncio.create_task(_progress(stack, expected, t0), name="progress")
        try:
            await asyncio.gather(*tasks)
        finally:
            progress.cancel()
        run_info["load"] = {
            "rows": direct.seq,
            "objects": objects.seq,
            "expected": expected.count,
            "insert_failures": direct.failures,
            "object_failures": objects.failures,
        }
        log(f"load over: {expected.count} one-shot rows stored; draining")
        await _drain(stack, config, run_info, t_end)
        if config.with_operator:
            await _object_statuses(stack, config, run_info)
        watchdog.cancel()
        await _dump(stack, rundir, run_info)
    finally:
        expected.close()
        if runner is not None:
            runner.close()
        run_info["exit_codes"] = await stack.stop_async()


async def _warm_up(stack: Stack, config: ChaosConfig, run_info: dict[str, Any]) -> None:
    deadline = time.monotonic() + 120
    while True:
        ready = [await stack.sidecar_ready(r) for r in stack.replicas.values()]
        holders = {}
        with contextlib.suppress(StoreError):
            holders = await stack.leaders()
        firsts = await _first_slots(stack, run_info)
        operator_ok = True
        if stack.operator is not None:
            operator_ok = await stack.operator.wait_healthy(await stack.open_http(), timeout=0.5)
        if all(ready) and len(holders) == len(stack.keys) and all(firsts) and operator_ok:
            break
        dead = [n for n, r in stack.replicas.items() if not r.process.alive()]
        if dead or time.monotonic() > deadline:
            raise HarnessError(
                f"warm-up failed: ready={sum(ready)}/{len(ready)} leaders={len(holders)} "
                f"first slots={sum(bool(f) for f in firsts)} operator={operator_ok} dead={dead}"
            )
        await asyncio.sleep(0.3)
    log(f"warm: {len(stack.replicas)} sidecars ready, a leader for every key, slots firing")


async def _first_slots(stack: Stack, run_info: dict[str, Any]) -> list[float | None]:
    try:
        rows = await stack.query(
            "SELECT s.uid, extract(epoch FROM min(p.due_at))::float8 FROM schedlock_schedules s "
            "LEFT JOIN schedlock_publishes p ON p.schedule_id = s.id GROUP BY s.uid"
        )
    except psycopg.Error:
        return [None]
    for uid, first in rows:
        if uid in run_info["schedules"]:
            run_info["schedules"][uid]["first_slot"] = first
    return [run_info["schedules"][u].get("first_slot") for u in run_info["schedules"]]


async def _watchdog(stack: Stack, run_info: dict[str, Any], t0: float) -> None:
    """A sidecar or the operator that exits on its own is a finding: record it, restart it."""
    exits: list[dict[str, Any]] = run_info.setdefault("unexpected_exits", [])
    while True:
        await asyncio.sleep(1.0)
        for name, replica in stack.replicas.items():
            proc = replica.process.process
            if replica.down or proc is None or proc.poll() is None:
                continue
            exits.append({"who": name, "code": proc.returncode, "t": round(time.time() - t0, 2)})
            log(f"  !! {name} exited on its own with {proc.returncode}; restarting it")
            replica.process.start()
        op = stack.operator
        if op is not None and op.process is not None and op.process.poll() is not None:
            # The fault runner respawns a killed operator itself; give it a moment.
            await asyncio.sleep(5)
            if op.process.poll() is not None:
                exits.append(
                    {
                        "who": "operator",
                        "code": op.process.returncode,
                        "t": round(time.time() - t0, 2),
                    }
                )
                log(f"  !! operator exited on its own with {op.process.returncode}; restarting")
                op.spawn()


async def _progress(stack: Stack, expected: Expected, t0: float) -> None:
    while True:
        await asyncio.sleep(30)
        with contextlib.suppress(psycopg.Error):
            rows = await stack.query(
                "SELECT state, count(*) FROM schedlock_publishes GROUP BY state ORDER BY state"
            )
            states = ", ".join(f"{s} {n}" for s, n in rows)
            log(f"t+{time.time() - t0:.0f}s: {expected.count} one-shot rows stored; rows: {states}")


async def _drain(stack: Stack, config: ChaosConfig, run_info: dict[str, Any], t_end: float) -> None:
    started = time.time()
    deadline = started + config.drain_timeout_seconds
    objects = [
        json.loads(line)["uid"]
        for line in (stack.rundir / "expected.jsonl").read_text().splitlines()
        if '"object"' in line
    ]
    pending = -1
    while time.time() < deadline:
        try:
            rows = await stack.query(
                "SELECT count(*) FILTER (WHERE state <> ALL(%s) "
                "AND (scheduler = 'publish' OR due_at <= to_timestamp(%s))), "
                "count(*) FILTER (WHERE uid = ANY(%s)) FROM schedlock_publishes",
                (list(TERMINAL), t_end, objects),
            )
            unfinished, objects_stored = int(rows[0][0]), int(rows[0][1])
            pending = unfinished + len(objects) - objects_stored
            if pending == 0:
                break
        except psycopg.Error as exc:
            log(f"drain: {exc}")
        await asyncio.sleep(1.0)
    await asyncio.sleep(1.0)  # in-flight receiver log lines
    run_info["drain_seconds"] = round(time.time() - started, 1)
    run_info["drain_pending"] = pending
    log(
        f"drained in {run_info['drain_seconds']} s"
        + (f" ({pending} still pending)" if pending else "")
    )


async def _object_statuses(stack: Stack, config: ChaosConfig, run_info: dict[str, Any]) -> None:
    """Every ScheduledPublish should end with status.phase Published: the operator's status
    sync (NOTIFY + sweep) must survive its own kills and the database restarts."""
    path = SP_API.format(ns=config.namespace)
    deadline = time.time() + 20
    phases: dict[str, int] = {}
    while time.time() < deadline:
        try:
            status, data = await stack.kube_request("GET", path)
        except (OSError, TimeoutError) as exc:
            log(f"listing objects: {exc!r}")
            await asyncio.sleep(1)
            continue
        phases = {}
        for item in data.get("items", []) if status == 200 else []:
            phase = str((item.get("status") or {}).get("phase"))
            phases[phase] = phases.get(phase, 0) + 1
        if set(phases) <= {"Published"}:
            break
        await asyncio.sleep(1)
    run_info["object_phases"] = phases
    log(f"ScheduledPublish phases: {phases}")


async def _dump(stack: Stack, rundir: Path, run_info: dict[str, Any]) -> None:
    """Every row's final state (``db-final.json``, the checker's ``RunData.db``) and every
    key's term, through the store's verbs on the current primary."""
    store = open_store(stack.admin_url, application_name="chaos-dump")
    try:
        rows: dict[str, PublishRecord] = {}
        position = SweepPosition(datetime.fromtimestamp(0, UTC))
        while True:  # the operator's sweep, from the beginning: every row, page by page
            page, position = await store.changed_since(position, DUMP_PAGE)
            rows.update((r.uid, r) for r in page)
            if len(page) < DUMP_PAGE:
                break
        keys = await store.key_status()
    finally:
        await store.close()
    db = {
        uid: {
            "scheduler": r.scheduler,
            "target": r.target,
            "state": r.state,
            "attempts": r.attempts,
            "term": r.term,
            "holder": r.holder,
            "last_error": r.last_error,
            "due": r.due_at.timestamp(),
        }
        for uid, r in rows.items()
    }
    (rundir / "db-final.json").write_text(json.dumps(db))
    terms = sorted(keys, key=lambda k: (k.scheduler, k.target))
    run_info["terms"] = [
        [k.scheduler, k.namespace, k.target, str(k.term), str(k.holder)] for k in terms
    ]


def _load(rundir: Path) -> checker.RunData | None:
    """The run's records, or None (said on stderr) when a file of them is not whole."""
    try:
        return checker.load(rundir)
    except checker.IncompleteRecords as exc:
        print(f"chaos: no verdict: {exc}", file=sys.stderr)
        return None


def check_only(rundir: Path, verdict_path: Path) -> int:
    data = _load(rundir)
    if data is None:
        return 2
    verdict, report = checker.check(data)
    report["logged"] = checker.log_levels(rundir)
    (rundir / "report.json").write_text(json.dumps(report, indent=1))
    checker.write_verdict(verdict, verdict_path)
    print(checker.summary(verdict, report))
    return 1 if report["violations"] else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit("run `python -m chaos`")
