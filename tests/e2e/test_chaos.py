"""The chaos run (``python -m chaos``) for two minutes, and the checker's rules on made-up logs.

The run starts its own PostgreSQL, kube-apiserver + etcd, the operator, two apps and ten
sidecars, injects a seeded schedule of faults and judges the apps' delivery logs; it must end
with exit status 0 and zeros where the verdict demands them.  ``CHAOS_SEED`` picks another
seed (the default one plans every fault kind within two minutes).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from chaos.checker import (
    MUST_BE_ZERO,
    VERDICT_KEYS,
    Fault,
    IncompleteRecords,
    RunData,
    check,
    load,
    sidecar_events,
)
from chaos.config import ChaosConfig
from chaos.plan import ALL_KINDS, plan_faults
from chaos.run import check_only
from schedlock.core.identities import slot_uid
from testbed.deliveries import Delivery

REPO = Path(__file__).resolve().parents[2]
SEED = int(os.environ.get("CHAOS_SEED", "3"))
DURATION = 120


def test_the_plan_is_seeded_and_covers_every_fault_kind() -> None:
    config = ChaosConfig(seed=SEED, duration=DURATION)
    plan = plan_faults(config)
    assert plan == plan_faults(ChaosConfig(seed=SEED, duration=DURATION))
    assert plan != plan_faults(ChaosConfig(seed=SEED + 1, duration=DURATION))
    if "CHAOS_SEED" not in os.environ:
        assert set(Counter(f.kind for f in plan)) == set(ALL_KINDS)
    assert all(f.at + f.hold <= DURATION - config.quiet_tail_seconds for f in plan)


@pytest.mark.timeout(DURATION + 480)
def test_chaos_run_loses_nothing_and_doubles_only_across_crashes(tmp_path: Path) -> None:
    verdict_path = tmp_path / "chaos-verdict.json"
    command = [
        sys.executable,
        "-m",
        "chaos",
        "--duration",
        str(DURATION),
        "--seed",
        str(SEED),
        "--verdict",
        str(verdict_path),
        "--workdir",
        str(tmp_path / "run"),  # removed after a pass, kept (logs, report.json) after a failure
    ]
    print("running:", " ".join(command))
    result = subprocess.run(
        command, cwd=REPO, capture_output=True, text=True, timeout=DURATION + 420, check=False
    )
    output = result.stdout + result.stderr
    print(output)
    assert result.returncode == 0, f"chaos run failed (seed {SEED}):\n{output[-6000:]}"
    verdict = json.loads(verdict_path.read_text())
    assert tuple(verdict) == VERDICT_KEYS
    for key in MUST_BE_ZERO:
        assert verdict[key] == 0, (key, verdict)
    assert verdict["expected"] > 1000
    # Direct rows stored while replication was cut before an asynchronous fail-over went down
    # with the old primary: stated under their own key, never under `lost`.
    assert verdict["delivered"] + verdict["lost_to_async_failover"] == verdict["expected"]
    assert verdict["faults"].get("failover_sync") and verdict["faults"].get("failover_async")
    injected = {k for k in verdict["faults"] if k != "unplanned_stepdown"}
    assert injected == set(ALL_KINDS) or "CHAOS_SEED" in os.environ, verdict["faults"]


# -------------------------------------------------------------------------------- the checker

NS = "chaos"
T0 = 1_000_000.0
CONFIG = ChaosConfig(seed=1, duration=60)


def entry(uid: str, t: float, term: int, holder: str, status: int = 200, key: str = "") -> Delivery:
    return Delivery(
        uid=uid,
        key=key or f"{uid}/due",
        term=term,
        attempt=1,
        holder=holder,
        target="alpha",
        arrival=T0 + t,
        status=status,
    )


def fault(kind: str, t: float, end: float | None = None, victim: str | None = "a-0") -> Fault:
    keys = frozenset({f"publish/{NS}/alpha", f"recurring/{NS}/alpha"})
    return Fault(kind, T0 + t, T0 + (t if end is None else end), victim, keys)


def judge(
    entries: list[Delivery],
    faults: list[Fault],
    expected: list[str] | None = None,
    stored: dict[str, tuple[str, float]] | None = None,
) -> dict[str, int]:
    """``stored``: uid -> (kind, seconds) of rows the harness stored at that time."""
    rows: dict[str, dict[str, Any]] = {
        u: {"kind": "row", "uid": u, "target": "alpha", "due": None} for u in expected or []
    }
    for uid, (kind, t) in (stored or {}).items():
        rows[uid] = {"kind": kind, "uid": uid, "target": "alpha", "due": None, "stored": T0 + t}
    data = RunData(
        config=CONFIG,
        t0=T0,
        t_end=T0 + 60,
        expected=rows,
        schedules={},
        entries=sorted(entries, key=lambda e: e.arrival),
        faults=faults,
        db={},
        stepdowns=[],
    )
    verdict, _ = check(data)
    return verdict


def test_checker_counts_a_lost_row_and_ignores_5xx_attempts() -> None:
    verdict = judge(
        [entry("r1", 1, 1, "a-0", status=503), entry("r2", 1, 1, "a-0")], [], ["r1", "r2"]
    )
    assert (verdict["expected"], verdict["delivered"], verdict["lost"]) == (2, 1, 1)


def test_checker_excuses_a_refire_across_a_kill_in_flight() -> None:
    entries = [entry("r1", 10.0, 1, "a-0"), entry("r1", 10.2, 2, "a-1")]
    verdict = judge(entries, [fault("kill_leader", 10.1)], ["r1"])
    assert verdict["delivered_twice_same_key"] == 1
    assert verdict["delivered_twice_without_crash"] == 0


def test_checker_flags_duplicates_the_faults_do_not_explain() -> None:
    same_term = [entry("r1", 10.0, 1, "a-0"), entry("r1", 12.0, 1, "a-0")]
    assert judge(same_term, [fault("kill_leader", 10.1)])["delivered_twice_without_crash"] == 1
    graceful = [entry("r2", 10.0, 1, "a-0"), entry("r2", 10.2, 2, "a-1")]
    assert judge(graceful, [fault("sigterm_leader", 10.1)])["delivered_twice_without_crash"] == 1
    long_before = [entry("r3", 5.0, 1, "a-0"), entry("r3", 10.2, 2, "a-1")]
    assert judge(long_before, [fault("kill_leader", 10.1)])["delivered_twice_without_crash"] == 1
    other_key = [entry("r4", 10.0, 1, "a-0"), entry("r4", 10.2, 2, "a-1", key="r4/other")]
    assert judge(other_key, [fault("kill_leader", 10.1)])["delivered_twice_without_crash"] == 1
    other_victim = [entry("r5", 10.0, 1, "a-0"), entry("r5", 10.2, 2, "a-1")]
    assert (
        judge(other_victim, [fault("kill_leader", 10.1, victim="a-3")])[
            "delivered_twice_without_crash"
        ]
        == 1
    )


def test_checker_flags_an_old_term_delivering_after_the_new_one() -> None:
    entries = [entry("r1", 10.0, 2, "a-1"), entry("r2", 14.0, 1, "a-0")]
    assert judge(entries, [])["overlapping_terms"] == 1
    # ... unless it is the tail of a frozen leader's in-flight request, right after SIGCONT
    assert judge(entries, [fault("sigstop_leader", 9.0, end=13.5)])["overlapping_terms"] == 0


def failover(kind: str, t: float, killed: float, end: float) -> Fault:
    keys = frozenset({f"publish/{NS}/alpha", f"recurring/{NS}/alpha"})
    detail = {"killed_at": T0 + killed, "read_only_advisory_locks": 0}
    return Fault(kind, T0 + t, T0 + end, None, keys, detail)


def test_checker_after_an_async_failover_excuses_a_refire_of_any_term_with_the_same_key() -> None:
    # Published at 11 while replication was cut (10..12): the outcome and term 3 are lost, the
    # new leader's term on the promoted server is 3 again and fires the row again.
    entries = [entry("r1", 11.0, 3, "a-0"), entry("r1", 13.0, 3, "a-1")]
    verdict = judge(entries, [failover("failover_async", 10.0, 12.0, 12.5)], ["r1"])
    assert verdict["delivered_twice_same_key"] == 1
    assert verdict["delivered_twice_without_crash"] == 0
    # ...a synchronous fail-over loses no term: the same term twice is not excused.
    verdict = judge(entries, [failover("failover_sync", 10.5, 10.5, 11.0)], ["r1"])
    assert verdict["delivered_twice_without_crash"] == 1
    # ...and another key is never excused.
    other = [entry("r2", 11.0, 3, "a-0"), entry("r2", 13.0, 4, "a-1", key="r2/other")]
    verdict = judge(other, [failover("failover_async", 10.0, 12.0, 12.5)], ["r2"])
    assert verdict["delivered_twice_without_crash"] == 1


def test_checker_states_direct_rows_lost_to_an_async_failover_but_never_objects() -> None:
    stored = {"row-in": ("row", 11.0), "row-before": ("row", 5.0), "object-in": ("object", 11.0)}
    verdict = judge([], [failover("failover_async", 10.0, 12.0, 12.5)], stored=stored)
    assert verdict["lost_to_async_failover"] == 1  # row-in
    assert verdict["lost"] == 2  # row-before, object-in (the operator must bring it back)
    sync = judge([], [failover("failover_sync", 10.0, 10.0, 10.5)], stored=stored)
    assert (sync["lost_to_async_failover"], sync["lost"]) == (0, 3)


def test_checker_a_lock_on_the_read_only_old_primary_is_a_violation() -> None:
    bad = failover("failover_sync", 10.0, 10.0, 10.5)
    bad.detail["read_only_advisory_locks"] = 2
    verdict = judge([], [bad])
    assert verdict["led_on_read_only"] == 2
    assert "led_on_read_only" in MUST_BE_ZERO


def slot(schedule: str, second: int, micros: int = 0) -> str:
    when = datetime.fromtimestamp(T0 + second, UTC) + timedelta(microseconds=micros)
    return slot_uid(schedule, when)


def restart_run(
    entries: list[Delivery], back_at: float, db: dict[str, Any] | None = None
) -> RunData:
    """Schedule ``s`` of target alpha over 60 s; the database restarts at 29.5 (up at 30.8)
    and a leader of its key is back at ``back_at``."""
    return RunData(
        config=CONFIG,
        t0=T0,
        t_end=T0 + 60,
        expected={},
        schedules={"s": {"target": "alpha", "first_slot": T0}},
        entries=sorted(entries, key=lambda e: e.arrival),
        faults=[fault("pg_restart", 29.5, end=30.8, victim=None)],
        db=db or {},
        stepdowns=[],
        acquisitions=[{"key": f"recurring/{NS}/alpha", "ts": T0 + back_at, "holder": "a-1"}],
    )


@pytest.mark.parametrize(("back_at", "missed", "skipped"), [(31.7, 1, 2), (31.2, 2, 1)])
def test_checker_slots_missed_doubled_and_skipped_by_an_outage(
    back_at: float, missed: int, skipped: int
) -> None:
    """Slots 20, 30, 31 never arrive; the database restarts at 29.5 and a leader is back at
    ``back_at``: 30 was skipped by design, 31 too unless the leader was back early enough in
    second 31 to fire it as the catch-up; 20 is missed either way."""
    entries = [
        entry(slot("s", s), s + 0.01, 1 if s < 30 else 2, "a-0" if s < 30 else "a-1")
        for s in range(61)
        if s not in (20, 30, 31)
    ]
    entries.append(entry(slot("s", 40, micros=1), 40.02, 2, "a-1"))  # a second uid, slot 40
    verdict, report = check(restart_run(entries, back_at))
    assert verdict["recurring_slots_missed"] == missed, report["recurring"]
    assert report["recurring"]["skipped_by_outage"] == skipped
    assert verdict["recurring_slots_doubled"] == 1, report["recurring"]  # second 40
    assert verdict["overlapping_terms"] == 0


def test_checker_a_slot_that_made_a_row_is_never_skipped_by_an_outage() -> None:
    entries = [entry(slot("s", s), s + 0.01, 1, "a-0") for s in range(61) if s != 30]
    data = restart_run(entries, 31.7, db={slot("s", 30): {"state": "firing"}})
    assert check(data)[0]["recurring_slots_missed"] == 1


def test_checker_reads_leadership_changes_from_the_event_field(tmp_path: Path) -> None:
    def line(event: str, level: str, ts: str, **fields: object) -> str:
        return json.dumps({"ts": ts, "level": level, "msg": "whatever", "event": event, **fields})

    key = f"publish/{NS}/alpha"
    (tmp_path / "a-0.log").write_text(
        "\n".join(
            [
                "not json",
                line("leadership_acquired", "info", "1970-01-12T13:46:40.000Z", key=key, term=1),
                line("lock_session_lost", "warning", "1970-01-12T13:46:50.500Z", key=key),
                line("lock_session_lost", "info", "1970-01-12T13:46:51.000Z", key=key),  # waiting
                # the message text is no signal: only the event is
                json.dumps({"ts": "1970-01-12T13:46:52Z", "msg": "acquired leadership"}),
            ]
        )
    )
    stepdowns, acquisitions = sidecar_events(tmp_path)
    assert acquisitions == [{"holder": "a-0", "ts": T0, "key": key, "term": 1}]
    assert stepdowns == [{"holder": "a-0", "ts": T0 + 10.5, "key": key, "error": None}]


def test_checker_draws_no_verdict_from_a_record_file_cut_short_or_corrupt(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The run's record files are read whole once their writers have stopped: a line cut by a
    killed writer, or a line that is not JSON, fails the check (exit 2, the file named), never
    a verdict drawn without the delivery it may have held."""
    run = {"config": CONFIG.to_json(), "t0": T0, "t_end": T0 + 60, "schedules": {}}
    (tmp_path / "run.json").write_text(json.dumps(run))
    deliveries = tmp_path / "receiver-a" / "deliveries.jsonl"
    deliveries.parent.mkdir()
    good = {
        "uid": "r1", "key": "r1/due", "term": 1, "attempt": 1, "holder": "a-0",
        "target": "alpha", "scheduledAt": "1970-01-12T13:46:40Z", "arrival": T0 + 1,
        "status": 200,
    }  # fmt: skip
    whole = json.dumps(good) + "\n" + json.dumps({**good, "arrival": T0 + 2}) + "\n"
    (tmp_path / "expected.jsonl").write_text(json.dumps({"kind": "row", "uid": "r1"}) + "\n")
    deliveries.write_text(whole)
    assert [e.arrival for e in load(tmp_path).entries] == [T0 + 1, T0 + 2]

    deliveries.write_text(whole[:-10])  # the second record cut by a kill
    with pytest.raises(IncompleteRecords, match="ends inside a record"):
        load(tmp_path)
    assert check_only(tmp_path, tmp_path / "verdict.json") == 2
    assert "no verdict" in capsys.readouterr().err
    assert not (tmp_path / "verdict.json").exists()

    deliveries.write_text(whole)
    (tmp_path / "faults.jsonl").write_text('{"kind": "kill", "start"\n')  # a whole line, not JSON
    with pytest.raises(IncompleteRecords, match=r"faults\.jsonl: a line is not a JSON record"):
        load(tmp_path)
