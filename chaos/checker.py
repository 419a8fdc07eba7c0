"""The verdict: what the apps received (the receivers' append-only logs) against what was expected.

Inputs, all in the run directory: ``receiver-*/deliveries.jsonl`` (the truth), ``expected.jsonl``
(every one-shot uid the harness stored), ``run.json`` (config, load window, schedules and their
first slot), ``faults.jsonl`` (what was injected, when, against whom), ``db-final.json`` (row
states at the end, for diagnosis only) and ``sidecars/*.log`` (leadership changes nobody
injected).  ``python -m chaos --check RUN_DIR`` recomputes the verdict from them.

Definitions (T = request timeout, s = slack, both from the config):

* A **delivery** is a receiver log entry answered 2xx; any other entry is an *attempt* (an
  injected 5xx, or a hung request logged with 504 that was never answered).
* A fault's **in-flight window** is when a delivery can have been sent by a term the fault ends
  without its outcome being recorded: from ``start - T - s`` to ``inflight_end``:
  kill ``start + s``; SIGSTOP ``SIGCONT + T + s``; partition ``start + lease-margin + T + s``
  (the leader goes on delivering already claimed rows until its heartbeat deadline);
  pg_terminate / PostgreSQL restart / synchronous fail-over ``start + T + s``; asynchronous
  fail-over (``start`` is when replication was cut) ``killed_at + T + s``: every outcome recorded
  while the standby heard nothing is lost with the old primary.  SIGTERM has no window: it is
  graceful.  A fault only touches the lock keys in its record (those the victim led when it
  struck; all keys for a PostgreSQL restart or a fail-over).
* A step-down the sidecars log (``lock_session_lost`` while leading) that no injected fault
  explains is an *unplanned step-down* (e.g. a heartbeat starved on a loaded machine).  It ends
  a term like a partition does, so it gets the same window, ending when it was logged; it is
  counted under ``faults["unplanned_stepdown"]``.
* ``delivered_twice_same_key``: a row's 2nd, 3rd… delivery where the previous delivery carried
  the same Idempotency-Key, came from a lower term, and lies in the in-flight window of a
  crash-like fault that hit that term's key before the re-delivery.  After an asynchronous
  fail-over the terms of the lost transactions are lost too, so there the re-delivery's term
  may be the same number or lower: only the key must match.
* ``lost_to_async_failover``: direct rows (``schedlock publish``/SQL, not objects) stored by
  the harness while replication was cut before an asynchronous fail-over (from ``start - s``
  to ``killed_at``) and never delivered: their insert went down with the old primary and
  nothing re-creates them.  Stated, not excused silently; objects have no such excuse (the
  operator re-asserts their rows) and count under ``lost``.
* ``led_on_read_only``: advisory locks seen on an old primary brought back read-only after a
  fail-over.  Must be 0.
* ``delivered_twice_without_crash``: every other extra delivery (same term, a different key,
  no such fault — e.g. across a SIGTERM).  Must be 0.
* ``overlapping_terms``: (lock key, old term, newer term) triples where the old term sent
  anything (delivery or attempt) after the newer term's first arrival, outside the in-flight
  window of a fault that ended the old term.  Must be 0.
* ``recurring_slots_*``: every ``@every 1s`` grid second (``@every Ns`` when the schedule says
  ``every_seconds``, as the demo's does) from the schedule's first slot to the end of the load
  is expected once.  A slot without delivery is *explained by an outage* when
  it lies in ``[fault start - 1 s, R)`` of a fault that touched the target's recurring key,
  where R is the first arrival of a newer term of that key after the fault (by design the new
  leader fires only the latest missed slot, so the others in that window are skipped), or
  *refused by the app* when every attempt of it was answered by an injected 5xx/hang and it
  ended missed.  ``recurring_slots_missed`` counts the rest.  ``recurring_slots_doubled``
  counts grid seconds delivered under two uids, or twice under one uid without an explaining
  fault.
"""

from __future__ import annotations

import collections
import itertools
import json
import math
import statistics
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.config import ChaosConfig
from chaos.plan import (
    CRASH_KINDS,
    FAILOVER_ASYNC,
    FAILOVER_SYNC,
    KILL,
    PARTITION,
    SIGTERM,
    STOP,
)
from schedlock.core.identities import Scheduler, parse_rfc3339, parse_slot_uid, scheduler_of
from schedlock.core.logs import Event, records
from testbed.deliveries import Delivery, complete_records

UNPLANNED = "unplanned_stepdown"
INJECTED_APP_STATUSES = frozenset({503, 504})
VERDICT_KEYS = (
    "expected",
    "delivered",
    "lost",
    "lost_to_async_failover",
    "delivered_twice_same_key",
    "delivered_twice_without_crash",
    "overlapping_terms",
    "led_on_read_only",
    "recurring_slots_missed",
    "recurring_slots_doubled",
    "faults",
)
MUST_BE_ZERO = (
    "lost",
    "delivered_twice_without_crash",
    "overlapping_terms",
    "led_on_read_only",
    "recurring_slots_missed",
    "recurring_slots_doubled",
)


@dataclass(frozen=True)
class Fault:
    kind: str
    start: float
    end: float
    victim: str | None
    keys: frozenset[str]
    detail: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


@dataclass
class RunData:
    config: ChaosConfig
    t0: float
    t_end: float
    expected: dict[str, dict[str, Any]]  # uid -> {kind, target, due}
    schedules: dict[str, dict[str, Any]]  # uid -> {target, first_slot}
    entries: list[Delivery]
    faults: list[Fault]
    db: dict[str, dict[str, Any]]  # uid -> final row
    stepdowns: list[dict[str, Any]]  # leading sidecars that logged lock_session_lost
    acquisitions: list[dict[str, Any]] = field(default_factory=list)  # leadership_acquired


# ------------------------------------------------------------------------------- loading


class IncompleteRecords(ValueError):
    """A finished run's record file does not hold whole records: no verdict is drawn from it."""


def _jsonl(path: Path) -> list[dict[str, Any]]:
    """Every record of a finished run's JSON-lines file (none if it was never written).

    Its writers (the receivers, the load, the fault runner) write a whole line at a time and
    have stopped when the checker reads: a line that does not parse, or a last line cut short
    (a writer killed mid-record), means the file lacks part of the run.  Skipping it could hide
    a delivery, and with it a duplicate, so it is said instead."""
    if not path.exists():
        return []
    try:
        records, tail = complete_records(path.read_bytes())
    except json.JSONDecodeError as exc:
        raise IncompleteRecords(f"{path}: a line is not a JSON record ({exc})") from None
    if tail.strip():
        raise IncompleteRecords(
            f"{path} ends inside a record ({tail[:60]!r}…): its writer stopped mid-line"
        )
    return records


def _ts(text: str) -> float:
    return parse_rfc3339(text).timestamp()


def load(rundir: Path) -> RunData:
    run = json.loads((rundir / "run.json").read_text())
    config = ChaosConfig.from_json(run["config"])
    entries: list[Delivery] = []
    for path in sorted(rundir.glob("receiver-*/deliveries.jsonl")):
        entries.extend(Delivery.from_receiver(e) for e in _jsonl(path))
    entries.sort(key=lambda e: e.arrival)
    faults = [
        Fault(
            kind=f["kind"],
            start=float(f["start"]),
            end=float(f["end"]),
            victim=f.get("victim"),
            keys=frozenset(f.get("keys") or ()),
            detail=f.get("detail") or {},
        )
        for f in _jsonl(rundir / "faults.jsonl")
        if not f.get("skipped") and f.get("start")
    ]
    expected = {e["uid"]: e for e in _jsonl(rundir / "expected.jsonl")}
    db_path = rundir / "db-final.json"
    db = json.loads(db_path.read_text()) if db_path.exists() else {}
    stepdowns, acquisitions = sidecar_events(rundir / "sidecars")
    return RunData(
        config=config,
        t0=float(run["t0"]),
        t_end=float(run["t_end"]),
        expected=expected,
        schedules=run["schedules"],
        entries=entries,
        faults=faults,
        db=db,
        stepdowns=stepdowns,
        acquisitions=acquisitions,
    )


def sidecar_events(logdir: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(step-downs while leading, leadership acquisitions) from the sidecars' JSON logs."""
    stepdowns: list[dict[str, Any]] = []
    acquisitions: list[dict[str, Any]] = []
    for path in sorted(logdir.glob("*.log")):
        text = path.read_text(errors="replace")
        for rec in records(text, Event.LOCK_SESSION_LOST, Event.LEADERSHIP_ACQUIRED):
            try:
                event = {"holder": path.stem, "ts": _ts(rec["ts"]), "key": str(rec.get("key"))}
            except (KeyError, ValueError):
                continue
            if rec["event"] == Event.LEADERSHIP_ACQUIRED:
                acquisitions.append({**event, "term": rec.get("term")})
            elif rec.get("level") == "warning":  # WARNING only when it was leading
                stepdowns.append({**event, "error": rec.get("error")})
    acquisitions.sort(key=lambda a: float(a["ts"]))
    return stepdowns, acquisitions


# ------------------------------------------------------------------------------- fault maths


def lock_key(entry: Delivery, namespace: str) -> str:
    return f"{scheduler_of(entry.uid)}/{namespace}/{entry.target}"


def inflight_window(fault: Fault, config: ChaosConfig) -> tuple[float, float]:
    t, s = config.request_timeout_seconds, config.slack_seconds
    lo = fault.start - t - s
    if fault.kind == KILL:
        return lo, fault.start + s
    if fault.kind == STOP:
        return lo, fault.end + t + s
    if fault.kind == PARTITION:
        return lo, fault.start + config.timings.step_down_after + t + s
    if fault.kind == UNPLANNED:
        return lo, fault.end + s
    if fault.kind == FAILOVER_ASYNC:
        return lo, float(fault.detail.get("killed_at") or fault.end) + t + s
    return lo, fault.start + t + s  # pg_terminate, pg_restart, failover_sync


def lost_window(fault: Fault, config: ChaosConfig) -> tuple[float, float] | None:
    """When a row stored by the harness may have gone down with the old primary."""
    if fault.kind != FAILOVER_ASYNC:
        return None
    return fault.start - config.slack_seconds, float(fault.detail.get("killed_at") or fault.end)


def touches(fault: Fault, holder: str, key: str) -> bool:
    if key not in fault.keys:
        return False
    return fault.victim is None or fault.victim == holder


def classify_stepdowns(data: RunData) -> tuple[list[Fault], list[dict[str, Any]]]:
    """Step-downs no injected fault explains become UNPLANNED faults (returned with details)."""
    cfg = data.config
    unplanned: list[Fault] = []
    details = []
    after = cfg.timings.lease_seconds + cfg.timings.heartbeat_seconds + 5 * cfg.slack_seconds
    for sd in data.stepdowns:
        explained = any(
            f.kind in CRASH_KINDS | {SIGTERM}
            and (f.victim is None or f.victim == sd["holder"])
            and f.start - cfg.slack_seconds <= sd["ts"] <= f.end + after
            for f in data.faults
        )
        if explained:
            continue
        start = sd["ts"] - cfg.timings.step_down_after - cfg.timings.heartbeat_seconds
        unplanned.append(
            Fault(UNPLANNED, start, sd["ts"], sd["holder"], frozenset({str(sd["key"])}))
        )
        details.append({**sd, "t": round(sd["ts"] - data.t0, 3)})
    return unplanned, details


def crashes(
    faults: list[Fault], cfg: ChaosConfig, entry: Delivery, key: str | None = None
) -> Iterator[tuple[Fault, float, float]]:
    """The crash-like faults that touched ``entry``'s lock key and holder, with their
    in-flight windows."""
    key = key or lock_key(entry, cfg.namespace)
    for f in faults:
        if (f.kind in CRASH_KINDS or f.kind == UNPLANNED) and touches(f, entry.holder, key):
            yield (f, *inflight_window(f, cfg))


def crash_explains(
    faults: list[Fault], cfg: ChaosConfig, first: Delivery, again: Delivery
) -> Fault | None:
    """The crash-like fault that ended ``first``'s term while its outcome was not recorded."""
    for f, lo, hi in crashes(faults, cfg, first):
        if lo <= first.arrival <= hi and f.start <= again.arrival:
            return f
    return None


def refire_excused(
    faults: list[Fault], cfg: ChaosConfig, prev: Delivery, cur: Delivery
) -> Fault | None:
    """The fault that excuses ``cur`` as a re-delivery of ``prev``: the same Idempotency-Key, a
    later term (after an asynchronous fail-over its terms are lost too, so any term), and a
    crash that ended ``prev``'s term while its outcome was not recorded."""
    cause = crash_explains(faults, cfg, prev, cur)
    if cause is None or cur.key != prev.key:
        return None
    return cause if cur.term > prev.term or cause.kind == FAILOVER_ASYNC else None


# ------------------------------------------------------------------------------- the checks


def check(data: RunData) -> tuple[dict[str, Any], dict[str, Any]]:
    """Return (verdict, report): the verdict has exactly VERDICT_KEYS."""
    cfg = data.config
    ns = cfg.namespace
    data.entries.sort(key=lambda e: e.arrival)
    unplanned, unplanned_details = classify_stepdowns(data)
    faults = data.faults + unplanned

    by_uid: dict[str, list[Delivery]] = collections.defaultdict(list)
    for e in data.entries:
        by_uid[e.uid].append(e)

    # -- duplicates ---------------------------------------------------------------------------
    same_key = 0
    without_crash: list[dict[str, Any]] = []
    excused: list[dict[str, Any]] = []
    unexplained_uids: set[str] = set()
    for uid, got in by_uid.items():
        oks = [e for e in got if e.ok]
        for prev, cur in itertools.pairwise(oks):
            cause = refire_excused(faults, cfg, prev, cur)
            if cause is not None:
                same_key += 1
                excused.append(
                    {
                        **_pair(uid, prev, cur, data.t0),
                        "fault": cause.kind,
                        "sent_after_fault_s": round(prev.arrival - cause.start, 3),
                    }
                )
            else:
                without_crash.append(_pair(uid, prev, cur, data.t0))
                unexplained_uids.add(uid)
    key_changes = [uid for uid, got in by_uid.items() if len({e.key for e in got}) > 1]

    # -- overlapping terms --------------------------------------------------------------------
    per_key: dict[str, list[Delivery]] = collections.defaultdict(list)
    for e in data.entries:
        per_key[lock_key(e, ns)].append(e)
    overlaps: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    overlaps_excused = 0
    for key, got in per_key.items():
        first_arrival: dict[int, float] = {}
        for e in got:
            first_arrival.setdefault(e.term, e.arrival)
        terms = sorted(first_arrival)
        for e in got:
            newer = [t for t in terms if t > e.term and first_arrival[t] < e.arrival]
            if not newer:
                continue
            successor = min(newer)
            if _overlap_excused(faults, cfg, e, key, first_arrival[successor]):
                overlaps_excused += 1
                continue
            overlaps.setdefault((key, e.term, successor), []).append(
                {
                    "uid": e.uid,
                    "holder": e.holder,
                    "status": e.status,
                    "t": round(e.arrival - data.t0, 3),
                    "newer_term_first_t": round(first_arrival[successor] - data.t0, 3),
                }
            )

    # -- one-shot rows ------------------------------------------------------------------------
    delivered = {uid for uid in data.expected if any(e.ok for e in by_uid.get(uid, ()))}
    windows_lost = [w for w in (lost_window(f, cfg) for f in data.faults) if w is not None]
    lost_async = sorted(
        uid
        for uid in set(data.expected) - delivered
        if data.expected[uid].get("kind") == "row"
        and any(lo <= float(data.expected[uid].get("stored") or 0) <= hi for lo, hi in windows_lost)
    )
    lost = sorted(set(data.expected) - delivered - set(lost_async))
    lost_details = [
        {
            "uid": uid,
            **data.expected[uid],
            "db": data.db.get(uid),
            "attempts_seen": len(by_uid.get(uid, ())),
        }
        for uid in lost[:50]
    ]
    unknown = sorted(
        uid for uid in by_uid if scheduler_of(uid) is Scheduler.PUBLISH and uid not in data.expected
    )

    # -- recurring ----------------------------------------------------------------------------
    recurring = _recurring(data, faults, by_uid, unexplained_uids)

    fault_counts = collections.Counter(f.kind for f in data.faults)
    if unplanned:
        fault_counts[UNPLANNED] = len(unplanned)
    verdict: dict[str, Any] = {
        "expected": len(data.expected),
        "delivered": len(delivered),
        "lost": len(lost),
        "lost_to_async_failover": len(lost_async),
        "delivered_twice_same_key": same_key,
        "delivered_twice_without_crash": len(without_crash),
        "overlapping_terms": len(overlaps),
        "led_on_read_only": sum(
            int(f.detail.get("read_only_advisory_locks") or 0)
            for f in data.faults
            if f.kind in (FAILOVER_SYNC, FAILOVER_ASYNC)
        ),
        "recurring_slots_missed": recurring["missed_count"],
        "recurring_slots_doubled": recurring["doubled_count"],
        "faults": dict(sorted(fault_counts.items())),
    }
    report: dict[str, Any] = {
        "seed": cfg.seed,
        "duration": cfg.duration,
        "violations": [k for k in MUST_BE_ZERO if verdict[k]],
        "deliveries_logged": len(data.entries),
        "attempts_not_2xx": sum(not e.ok for e in data.entries),
        "lost": lost_details,
        "lost_to_async_failover": lost_async[:50],
        "duplicates_without_crash": without_crash[:50],
        "duplicates_excused_by": dict(collections.Counter(d["fault"] for d in excused)),
        "duplicates_excused": excused[:200],
        "overlapping_terms": [
            {"key": k, "old_term": o, "new_term": n, "late": v[:5], "late_count": len(v)}
            for (k, o, n), v in sorted(overlaps.items())
        ],
        "overlaps_excused": overlaps_excused,
        "idempotency_key_changed": key_changes[:20],
        "unknown_uids": unknown[:20],
        "unplanned_stepdowns": unplanned_details,
        "recurring": {
            k: v for k, v in recurring.items() if k not in ("missed_count", "doubled_count")
        },
        "lateness": _lateness(data, by_uid),
        "failovers": _failovers(data),
        "notes": _notes(data, key_changes, unknown),
    }
    return verdict, report


def _notes(data: RunData, key_changes: list[str], unknown: list[str]) -> list[str]:
    """Things worth a look that the verdict does not count."""
    notes = []
    bad_stops = [
        f"{f.victim} exit {f.detail.get('exit_code')}"
        for f in data.faults
        if f.kind == SIGTERM and f.detail.get("exit_code") != 0
    ]
    if bad_stops:
        notes.append(f"SIGTERM did not end in exit 0: {', '.join(bad_stops)}")
    if key_changes:
        notes.append(f"{len(key_changes)} uids arrived under more than one Idempotency-Key")
    if unknown:
        notes.append(f"{len(unknown)} one-shot uids arrived that the harness never stored")
    return notes


def _pair(uid: str, prev: Delivery, cur: Delivery, t0: float) -> dict[str, Any]:
    return {
        "uid": uid,
        "first": {
            "t": round(prev.arrival - t0, 3),
            "term": prev.term,
            "holder": prev.holder,
            "key": prev.key,
        },
        "again": {
            "t": round(cur.arrival - t0, 3),
            "term": cur.term,
            "holder": cur.holder,
            "key": cur.key,
        },
    }


def _overlap_excused(
    faults: list[Fault], cfg: ChaosConfig, late: Delivery, key: str, successor_first: float
) -> bool:
    return any(
        f.start <= successor_first and late.arrival <= hi
        for f, _, hi in crashes(faults, cfg, late, key)
    )


def _slot_of(uid: str) -> tuple[str, float] | None:
    slot = parse_slot_uid(uid)
    return None if slot is None else (slot[0], slot[1].timestamp())


def _recurring(
    data: RunData,
    faults: list[Fault],
    by_uid: dict[str, list[Delivery]],
    unexplained_uids: set[str],
) -> dict[str, Any]:
    delivered: dict[tuple[str, int], set[str]] = collections.defaultdict(set)
    attempted: dict[tuple[str, int], list[Delivery]] = collections.defaultdict(list)
    off_grid = []
    for uid, got in by_uid.items():
        slot = _slot_of(uid)
        if slot is None or slot[0] not in data.schedules:
            continue
        schedule, when = slot
        grid = round(when)
        if abs(when - grid) > 0.001:
            off_grid.append(uid)
        attempted[(schedule, grid)].extend(got)
        if any(e.ok for e in got):
            delivered[(schedule, grid)].add(uid)
    materialized: set[tuple[str, int]] = set()
    for uid in data.db:
        slot = _slot_of(uid)
        if slot is not None:
            materialized.add((slot[0], round(slot[1])))

    windows = outage_windows(data, faults)
    missed: list[dict[str, Any]] = []
    skipped_by_outage = 0
    refused_by_app = 0
    doubled: list[dict[str, Any]] = []
    expected_slots = 0
    delivered_slots = 0
    for uid, info in data.schedules.items():
        target = info["target"]
        first = info.get("first_slot")
        if first is None:
            continue
        every = int(info.get("every_seconds") or 1)
        for grid in range(round(first), math.floor(data.t_end) + 1, every):
            expected_slots += 1
            uids = delivered.get((uid, grid), set())
            if len(uids) > 1 or (uids & unexplained_uids):
                doubled.append({"schedule": uid, "slot": grid, "uids": sorted(uids)})
            if uids:
                delivered_slots += 1
                continue
            tries = attempted.get((uid, grid), [])
            if (uid, grid) not in materialized:
                # Never made a row: only the catch-up rule of an outage may skip it.
                if any(lo <= grid < hi for lo, hi, _ in windows[target]):
                    skipped_by_outage += 1
                    continue
            else:
                states = {str((data.db.get(e.uid) or {}).get("state")) for e in tries}
                if (
                    tries
                    and all(e.status in INJECTED_APP_STATUSES for e in tries)
                    and states <= {"missed", "failed"}
                ):
                    refused_by_app += 1
                    continue
            missed.append(
                {
                    "schedule": uid,
                    "slot": grid,
                    "t": round(grid - data.t0, 3),
                    "materialized": (uid, grid) in materialized,
                    "attempts": [
                        {"status": e.status, "t": round(e.arrival - data.t0, 3), "term": e.term}
                        for e in tries[:5]
                    ],
                }
            )
    return {
        "missed_count": len(missed),
        "doubled_count": len(doubled),
        "expected_slots": expected_slots,
        "delivered_slots": delivered_slots,
        "skipped_by_outage": skipped_by_outage,
        "refused_by_app": refused_by_app,
        "missed": missed[:50],
        "doubled": doubled[:50],
        "off_grid": off_grid[:20],
        "outage_windows": {
            t: [
                {"from": round(lo - data.t0, 3), "to": round(hi - data.t0, 3), "kind": k}
                for lo, hi, k in w
            ]
            for t, w in windows.items()
        },
    }


def outage_windows(data: RunData, faults: list[Fault]) -> dict[str, list[tuple[float, int, str]]]:
    """Per target, [from, to) grid seconds a fault may have left unmaterialised by design.

    A fault that touched the target's recurring key stalls its materialisation from its start
    until a leader is back: the first ``leadership_acquired`` of that key after the fault (or the
    heal, when the leader just resumed).  That leader fires the latest slot at or before the
    moment it materialises (the catch-up) and skips the earlier ones, so slots from one second
    before the fault up to, not including, the catch-up second are excused.  When the
    acquisition falls in the second half of a second the catch-up may already be the next
    second, so that second is excused too.
    """
    cfg = data.config
    bound = cfg.timings.lease_seconds + cfg.timings.heartbeat_seconds + 5 * cfg.slack_seconds
    windows: dict[str, list[tuple[float, int, str]]] = {t: [] for t in cfg.targets}
    for target in cfg.targets:
        key = f"{Scheduler.RECURRING}/{cfg.namespace}/{target}"
        for f in faults:
            if f.kind not in CRASH_KINDS | {SIGTERM, UNPLANNED} or key not in f.keys:
                continue
            back = next(
                (
                    float(a["ts"])
                    for a in data.acquisitions
                    if a["key"] == key and f.start < float(a["ts"]) <= f.end + bound
                ),
                f.end,
            )
            hi = math.floor(back) + (1 if back - math.floor(back) >= 0.5 else 0)
            windows[target].append((f.start - 1.0, hi, f.kind))
    return windows


def _lateness(data: RunData, by_uid: dict[str, list[Delivery]]) -> dict[str, Any]:
    """Seconds from due to the first 2xx arrival, for rows whose due time is known."""
    late = []
    for uid, row in data.db.items():
        due = row.get("due")
        if due is None or uid not in by_uid:
            continue
        first_ok = next((e.arrival for e in by_uid[uid] if e.ok), None)
        if first_ok is not None:
            late.append(first_ok - float(due))
    if not late:
        return {}
    late.sort()
    return {
        "rows": len(late),
        "p50_ms": round(statistics.median(late) * 1000, 1),
        "p99_ms": round(late[int(len(late) * 0.99) - 1] * 1000, 1),
        "max_s": round(late[-1], 3),
    }


def first_new_term_arrival(entries: list[Delivery], start: float) -> float | None:
    """When the first delivery of a term newer than the last one seen by ``start`` arrived
    (``entries``: one lock key's, in arrival order): the hand-over as the app sees it."""
    before = max((e.term for e in entries if e.arrival <= start), default=0)
    return next((e.arrival for e in entries if e.arrival > start and e.term > before), None)


def _failovers(data: RunData) -> list[dict[str, Any]]:
    """For each leader-ending fault: seconds until a newer term's first arrival per key."""
    out = []
    per_key: dict[str, list[Delivery]] = collections.defaultdict(list)
    for e in data.entries:
        per_key[lock_key(e, data.config.namespace)].append(e)
    for f in data.faults:
        if f.kind not in CRASH_KINDS | {SIGTERM}:
            continue
        gaps = {}
        for key in sorted(f.keys):
            nxt = first_new_term_arrival(per_key.get(key, []), f.start)
            gaps[key] = None if nxt is None else round(nxt - f.start, 3)
        out.append(
            {
                "kind": f.kind,
                "t": round(f.start - data.t0, 3),
                "victim": f.victim,
                "first_new_term_after_s": gaps,
            }
        )
    return out


def log_levels(rundir: Path) -> dict[str, Any]:
    """Warnings and errors the sidecars and the operator logged, by event (report only; by
    message for library records, which have no event)."""
    counts: dict[str, collections.Counter[str]] = {
        "error": collections.Counter(),
        "warning": collections.Counter(),
    }
    samples: dict[str, str] = {}
    paths = [*sorted((rundir / "sidecars").glob("*.log")), rundir / "operator" / "operator.log"]
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                if line.strip() and not line.startswith(" "):
                    counts["error"][f"{path.parent.name}: non-JSON: {line[:100]}"] += 1
                continue
            level = str(rec.get("level"))
            if level in ("error", "critical"):
                level = "error"
            if level not in counts:
                continue
            what = f"{rec.get('logger')}: {rec.get('event') or rec.get('msg')}"
            counts[level][what] += 1
            samples.setdefault(what, json.dumps(rec)[:600])
    return {
        level: [{"what": w, "count": n, "sample": samples.get(w)} for w, n in c.most_common(30)]
        for level, c in counts.items()
    }


def write_verdict(verdict: dict[str, Any], path: Path) -> None:
    assert tuple(verdict) == VERDICT_KEYS
    path.write_text(json.dumps(verdict, indent=2) + "\n")


def summary(verdict: dict[str, Any], report: dict[str, Any]) -> str:
    rec = report["recurring"]
    lines = [
        f"seed {report['seed']}: {verdict['expected']} one-shot rows expected, "
        f"{verdict['delivered']} delivered, {verdict['lost']} lost, "
        f"{verdict['lost_to_async_failover']} direct rows lost to an asynchronous fail-over",
        f"  duplicates: {verdict['delivered_twice_same_key']} across a crash (same key; by "
        f"fault: {report['duplicates_excused_by']}), "
        f"{verdict['delivered_twice_without_crash']} without one",
        f"  led on a read-only old primary: {verdict['led_on_read_only']} advisory locks",
        f"  overlapping terms: {verdict['overlapping_terms']} "
        f"(late arrivals inside a crash's in-flight window: {report['overlaps_excused']})",
        f"  recurring: {rec['expected_slots']} slots, {rec['delivered_slots']} delivered, "
        f"{rec['skipped_by_outage']} skipped by an outage, {rec['refused_by_app']} refused by "
        f"the app, {verdict['recurring_slots_missed']} missed, "
        f"{verdict['recurring_slots_doubled']} doubled",
        f"  faults: {verdict['faults']}",
        f"  lateness of first delivery: {report['lateness']}",
    ]
    if report["unplanned_stepdowns"]:
        lines.append(f"  unplanned step-downs: {len(report['unplanned_stepdowns'])}")
    for note in report.get("notes", []):
        lines.append(f"  note: {note}")
    lines.append(
        "VERDICT: "
        + ("FAIL " + ", ".join(report["violations"]) if report["violations"] else "PASS")
    )
    return "\n".join(lines)
