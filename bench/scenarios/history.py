"""History: the hot paths with 0 and with millions of finished rows, side by side; the pruner's backlog.

Two databases on the benchmark's one PostgreSQL: ``empty`` (the schema only) and ``loaded``
(``history_rows`` finished rows over ``history_keys`` keys, :mod:`bench.history_rows`).  The
empty one is measured first, then the loaded one is built (its load time is part of the
results) and measured the same way — no TRUNCATE, no second load.  On each:

* **lateness** — ``history_lateness_rows`` rows due evenly over ``history_lateness_span_s`` on
  key 0 (which has its share of the history), led by a real sidecar of ``replicas``; arrival at
  the app minus due time, over ``history_lateness_trials`` trials;
* **throughput** — ``history_throughput_rows`` rows due at once on the same key: delivered /
  (last arrival − due time);
* **``schedlock status``** — the CLI's wall time (a process start included, as an operator
  types it), and the store verb it runs (``key_status``) alone;
* **the operator's status sync, first sweep** — :class:`schedlock.operator.sync.StatusSync`
  itself, without Kubernetes: its API is a stand-in that counts the GETs (every object of the
  history is gone, as after years of deletions) and finds no object; kopf's index is empty and,
  where the sync knows about kopf's listing, listed.  Rows read, pages, ``latest_slot`` probes,
  GETs and the time the sweep took.

Sidecars run with retention off while measuring (``SCHEDLOCK_RETENTION_SECONDS=0`` and its
failed twin, ignored by a tree without the pruner), so the history stays what was loaded.

Then, on the loaded database, the **prune backlog**: sidecars with a retention that leaves
``history_backlog_rows`` of the loaded rows expired; the expired count is polled until it is 0
or ``history_prune_cap_s`` has passed, while rows due at 50 a second on key 0 measure the
lateness during the prune.  A tree without the pruner (``schedlock.store.retention``) skips this
part with a message in the results.

Targets (the issue's): lateness p99 with history ≤ 1.5× the empty database's; ``schedlock
status`` < 2 s with history; the backlog cleared within 10 minutes while lateness p99 stays
under the product's 100 ms.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, cast

from bench import history_rows, trials
from bench.context import Context
from bench.rows import RowStream, due_times
from bench.stats import summarize
from bench.systems import SchedlockInstance, until
from schedlock.operator.settings import OperatorSettings
from schedlock.operator.sync import StatusSync
from schedlock.store import Store, open_store
from testbed.rows import fetch

TARGET_P99_RATIO = 1.5
TARGET_STATUS_S = 2.0
TARGET_PRUNE_S = 600.0
PRUNE_LATENESS_P99_MS = 100.0  # the product's lateness target (docs/performance.md)
PRUNE_ROWS_PER_S = 50.0
PRUNE_POLL_S = 5.0
RETENTION_OFF = {"SCHEDLOCK_RETENTION_SECONDS": "0", "SCHEDLOCK_FAILED_RETENTION_SECONDS": "0"}
FINISHED_STATES = ("published", "failed", "missed", "cancelled")
DELETED = "SELECT n_tup_del FROM pg_stat_user_tables WHERE relname = 'schedlock_publishes'"


def pruner_available() -> bool:
    return importlib.util.find_spec("schedlock.store.retention") is not None


class HistoryInstance(SchedlockInstance):
    """schedlock on key 0 of the history (``hist-ns-0``/``app-0``), with extra settings."""

    short = "hist"

    def __init__(self, ctx: Context, label: str) -> None:
        namespace, target = history_rows.key_of(0)
        super().__init__(
            ctx.env, ctx.profile, label, ctx.profile.replicas, namespace=namespace, target=target
        )
        self.extra_env: dict[str, str] = dict(RETENTION_OFF)

    def settings(self) -> dict[str, str]:
        return {**super().settings(), **self.extra_env}


async def _start(inst: HistoryInstance, env: dict[str, str]) -> None:
    inst.extra_env = env
    inst.start()
    await inst.wait_ready()
    await until(inst.leader_name, 60, 0.05, "a history leader")


def _stop(inst: HistoryInstance) -> None:
    """Stop the replicas, keep the receiver (the next phase starts new replicas)."""
    for replica in inst.replicas:
        replica.stop()
    inst.replicas.clear()


# -- the measurements ------------------------------------------------------------------------------


STATUS_RUNS = 3


def _status_once(url: str, cap_s: float) -> tuple[float, int] | None:
    """One ``schedlock status --json``: (wall seconds, keys listed); None past ``cap_s``."""
    started = time.monotonic()
    try:
        out = subprocess.run(
            [str(Path(sys.executable).parent / "schedlock"), "status", "--json"],
            env={**os.environ, "SCHEDLOCK_DATABASE_URL": url},
            capture_output=True,
            text=True,
            timeout=cap_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return None
    if out.returncode != 0:
        raise RuntimeError(f"schedlock status failed: {out.stderr.strip()}")
    return time.monotonic() - started, out.stdout.count('"target"')


def _status_cli(url: str, cap_s: float) -> dict[str, Any]:
    """``schedlock status`` as a person runs it, process start included: the median of
    :data:`STATUS_RUNS` runs (a process start on a busy machine varies by a second), or the cap
    when one run reaches it."""
    runs: list[float] = []
    keys = 0
    for _ in range(STATUS_RUNS):
        once = _status_once(url, cap_s)
        if once is None:
            return {"seconds": cap_s, "censored": True, "runs": runs}
        runs.append(round(once[0], 3))
        keys = once[1]
    return {"seconds": sorted(runs)[len(runs) // 2], "censored": False, "runs": runs, "keys": keys}


async def _key_status(url: str, cap_s: float) -> dict[str, Any]:
    store = open_store(url, application_name="bench-history-status")
    try:
        started = time.monotonic()
        try:
            keys = await asyncio.wait_for(store.key_status(), cap_s)
        except TimeoutError:
            return {"seconds": cap_s, "censored": True}
        return {
            "seconds": round(time.monotonic() - started, 3),
            "censored": False,
            "keys": len(keys),
        }
    finally:
        await store.close()


class _GoneObjects:
    """The sync's Kubernetes API for the benchmark: every object of the history is gone."""

    def __init__(self) -> None:
        self.gets = 0
        self.patches = 0

    async def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.gets += 1
        return None

    async def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.patches += 1

    async def post_event(
        self, obj: dict[str, Any], *, type_: str, reason: str, message: str
    ) -> None:
        return None


class _CountingStore:
    """The store, counting what the sync reads (pages, rows, latest_slot probes)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.pages = 0
        self.rows = 0
        self.latest_slots = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def changed_since(self, *args: Any, **kwargs: Any) -> Any:
        records, position = await self._store.changed_since(*args, **kwargs)
        self.pages += 1
        self.rows += len(records)
        return records, position

    async def latest_slot(self, schedule_uid: str) -> Any:
        self.latest_slots += 1
        return await self._store.latest_slot(schedule_uid)


def _sync_options() -> dict[str, Any]:
    """The StatusSync arguments this tree's sync takes beyond the store and the API: the
    operator's defaults, kopf's listing done (it lists before any sync in the operator)."""
    fields = {f.name for f in dataclasses.fields(StatusSync)}
    defaults = {f.name: f.default for f in dataclasses.fields(OperatorSettings)}
    options: dict[str, Any] = {}
    if "catch_up_seconds" in fields:
        options["catch_up_seconds"] = defaults["sync_catch_up_seconds"]
    if "listed" in fields:
        listed = asyncio.Event()
        listed.set()
        options["listed"] = listed
    return options


async def _sync_first_sweep(url: str, cap_s: float) -> dict[str, Any]:
    store = open_store(url, application_name="bench-history-sync")
    counting = _CountingStore(store)
    kube = _GoneObjects()
    sync = StatusSync(
        cast(Store, counting),
        kube,
        sweep_seconds=5.0,
        holder="bench-history-sync",
        **_sync_options(),
    )
    started = time.monotonic()
    try:
        try:
            await asyncio.wait_for(sync.sweep(), cap_s)
            censored = False
        except TimeoutError:
            censored = True
        seconds = time.monotonic() - started
    finally:
        await store.close()
    return {
        "seconds": round(seconds, 3),
        "censored": censored,
        "pages": counting.pages,
        "rows_read": counting.rows,
        "latest_slot_calls": counting.latest_slots,
        "kube_gets": kube.gets,
    }


async def _measure(ctx: Context, inst: HistoryInstance, label: str) -> dict[str, Any]:
    p = ctx.profile
    await _start(inst, dict(RETENTION_OFF))
    try:
        late: list[float] = []
        for trial in range(p.history_lateness_trials):
            late += await trials.lateness(
                inst,
                f"late{trial}",
                count=p.history_lateness_rows,
                span_s=p.history_lateness_span_s,
                drain_s=p.lateness_drain_s,
            )
        entry = summarize(late, censored=0)
        tput = await trials.throughput(
            inst, "tput", rows=p.history_throughput_rows, cap_s=p.throughput_cap_s
        )
    finally:
        _stop(inst)
    ctx.series.setdefault("history_lateness_ms", {})[label] = late
    status = _status_cli(inst.db_url, p.history_cap_s)
    verb = await _key_status(inst.db_url, p.history_cap_s)
    sweep = await _sync_first_sweep(inst.db_url, p.history_cap_s)
    result = {
        "lateness_ms": entry,
        "throughput": tput,
        "status_cli": status,
        "key_status": verb,
        "sync_first_sweep": sweep,
        "rows_in_table": int(fetch(inst.db_url, "SELECT count(*) FROM schedlock_publishes")[0][0]),
    }
    ctx.say(
        f"history {label}: lateness p50 {entry['p50']} / p99 {entry['p99']} ms, "
        f"{tput['fires_per_s']} fires/s, schedlock status {status['seconds']} s, "
        f"sync first sweep {sweep['seconds']} s ({sweep['rows_read']} rows, "
        f"{sweep['kube_gets']} GETs){' (capped)' if sweep['censored'] else ''}"
    )
    return result


def _ratio(loaded: float | None, empty: float | None) -> float | None:
    if loaded is None or empty is None or empty <= 0:
        return None
    return round(loaded / empty, 2)


# -- the prune backlog --------------------------------------------------------------------------


def _deleted(inst: HistoryInstance) -> int:
    """Rows deleted from schedlock_publishes so far, by the statistics collector (the
    harness's view, whichever sidecar prunes; each counts its own batches in
    schedlock_history_pruned_rows_total)."""
    return int(fetch(inst.db_url, DELETED)[0][0])


async def _prune(
    ctx: Context, inst: HistoryInstance, loaded: history_rows.Loaded
) -> dict[str, Any]:
    p = ctx.profile
    if not pruner_available():
        message = "skipped: this tree has no pruner (schedlock.store.retention, issue 19)"
        ctx.say(f"history prune {message}")
        return {"skipped": message}
    backlog = min(p.history_backlog_rows, loaded.rows)
    # The retention is set when the sidecars start; a minute's margin for the start itself.
    retention = loaded.retention_leaving(backlog, time.time() + 60)
    # Per finished state, on that state's own partial index (0005), as the pruner's metrics
    # read them: an IN over the states matches none of them, and its plan (a sequential scan
    # stopping at the first expired row) would start where the pruner's deleted rows lie.
    cutoff_sql = f"now() - make_interval(secs => {retention:.3f})"
    expired_count = " + ".join(
        f"(SELECT count(*) FROM schedlock_publishes WHERE state = '{state}' "
        f"AND updated_at < {cutoff_sql})"
        for state in FINISHED_STATES
    )
    expired_left = " OR ".join(
        f"(SELECT min(updated_at) FROM schedlock_publishes WHERE state = '{state}') < {cutoff_sql}"
        for state in FINISHED_STATES
    )
    # Counted once before and once after (a count reads every expired row's index entry);
    # while it runs, progress is the statistics' deleted rows and the end an index probe per
    # state for the oldest row.
    expired_at_start = int(fetch(inst.db_url, f"SELECT {expired_count}")[0][0])
    before_total = int(fetch(inst.db_url, "SELECT count(*) FROM schedlock_publishes")[0][0])
    stream = RowStream(
        inst.db_url,
        prefix="prune",
        spacing=1 / PRUNE_ROWS_PER_S,
        namespace=inst.namespace,
        target=inst.target,
    )
    env = {
        "SCHEDLOCK_RETENTION_SECONDS": f"{retention:.0f}",
        "SCHEDLOCK_FAILED_RETENTION_SECONDS": f"{retention:.0f}",
        "SCHEDLOCK_PRUNE_INTERVAL_SECONDS": "5",
    }
    ctx.say(f"history prune: {expired_at_start:,} expired rows (retention {retention:,.0f} s)")
    progress: list[tuple[float, int]] = []
    deleted_before = _deleted(inst)
    started = time.monotonic()
    await _start(inst, env)
    try:
        left = True
        next_poll = time.monotonic() + PRUNE_POLL_S
        while left and time.monotonic() - started < p.history_prune_cap_s:
            stream.top_up()
            await asyncio.sleep(0.25)
            if time.monotonic() >= next_poll:
                next_poll += PRUNE_POLL_S
                left = bool(fetch(inst.db_url, f"SELECT coalesce({expired_left}, false)")[0][0])
                deleted = _deleted(inst) - deleted_before
                progress.append((round(time.monotonic() - started, 1), deleted))
        cleared_s = time.monotonic() - started
        drain_until = time.time() + p.lateness_drain_s
        while time.time() < drain_until:
            await asyncio.sleep(0.25)
    finally:
        stream.close()
        _stop(inst)
    expired_at_end = int(fetch(inst.db_url, f"SELECT {expired_count}")[0][0]) if left else 0
    cutoff = time.time()
    # the rows due before the drain began: each had the drain's time to arrive
    due = {
        u: at
        for u, at in due_times(inst.db_url, "prune").items()
        if at < cutoff - p.lateness_drain_s
    }
    late = trials.late_ms(inst, due, cutoff)
    entry = summarize(late)
    ctx.series.setdefault("history_lateness_ms", {})["during prune"] = late
    after_total = int(fetch(inst.db_url, "SELECT count(*) FROM schedlock_publishes")[0][0])
    result = {
        "retention_s": round(retention),
        "expired_at_start": expired_at_start,
        "expired_at_end": expired_at_end,
        "cleared": not left,
        "seconds": round(cleared_s, 1),
        "rows_deleted": before_total + stream.issued - after_total,
        "progress": progress,  # (seconds, rows deleted so far)
        "lateness_ms": entry,
    }
    ctx.say(
        f"history prune: {result['rows_deleted']:,} rows deleted in {result['seconds']} s, "
        f"{expired_at_end:,} expired left; lateness p50 {entry['p50']} / p99 {entry['p99']} ms"
    )
    return result


async def run(ctx: Context) -> None:
    p = ctx.profile
    empty = HistoryInstance(ctx, "empty")
    loaded_inst = HistoryInstance(ctx, "loaded")
    try:
        results: dict[str, Any] = {"rows": p.history_rows, "keys": p.history_keys}
        results["empty"] = await _measure(ctx, empty, "empty")
        ctx.say(f"history: loading {p.history_rows:,} finished rows over {p.history_keys} keys")
        loaded = await asyncio.to_thread(
            history_rows.load,
            loaded_inst.db_url,
            rows=p.history_rows,
            keys=p.history_keys,
            say=ctx.say,
        )
        results["load"] = loaded.as_json()
        ctx.say(
            f"history: loaded in {loaded.insert_s:.0f} s + VACUUM ANALYZE {loaded.vacuum_analyze_s:.0f} s, "
            f"{loaded.table_mb:,.0f} MB, {loaded.heap_bytes_per_row:.0f} heap bytes a row"
        )
        results["history"] = await _measure(ctx, loaded_inst, "history")
        e, h = results["empty"], results["history"]
        results["ratio"] = {
            "lateness_p50": _ratio(h["lateness_ms"]["p50"], e["lateness_ms"]["p50"]),
            "lateness_p99": _ratio(h["lateness_ms"]["p99"], e["lateness_ms"]["p99"]),
            "throughput": _ratio(h["throughput"]["fires_per_s"], e["throughput"]["fires_per_s"]),
            "status_cli": _ratio(h["status_cli"]["seconds"], e["status_cli"]["seconds"]),
            "sync_first_sweep": _ratio(
                h["sync_first_sweep"]["seconds"], e["sync_first_sweep"]["seconds"]
            ),
        }
        results["targets"] = {
            "lateness_p99_ratio_max": TARGET_P99_RATIO,
            "status_s_max": TARGET_STATUS_S,
            "prune_s_max": TARGET_PRUNE_S,
            "prune_lateness_p99_ms_max": PRUNE_LATENESS_P99_MS,
        }
        results["prune"] = await _prune(ctx, loaded_inst, loaded)
        ctx.results["history"] = results
    finally:
        empty.stop()
        loaded_inst.stop()
