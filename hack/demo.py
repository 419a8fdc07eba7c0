"""``make demo``: three sidecar replicas, one leader, two hand-overs, nothing lost.

A fixed chaos plan (``PLAN``) carried out by :class:`chaos.local.LocalRun`, and a printer.
Needs only Python (the project's ``.venv``): an embedded PostgreSQL is started under ``.demo/``
unless ``DATABASE_URL`` points at one (a role that may create the schema).  The demo

1. migrates the schema (``schedlock migrate``), starts the recording app and three ``schedlock
   sidecar`` replicas of app ``demo`` in namespace ``default`` (lease 5 s, heartbeat 1 s; their
   text logs go to ``.demo/run-*/``);
2. creates a recurring schedule (``schedlock schedule --cron '@every 2s'``) and 30 one-shot
   publishes due every 0.5 s over 15 s (through the store API, ``upsert_publish``);
3. carries out ``PLAN``: the app turns slow so that a delivery is in flight when the publish
   leader is SIGKILLed (the next leader re-fires it with the same Idempotency-Key), the killed
   replica comes back 1.5 s later as Kubernetes would restart it, and the next publish leader
   is SIGTERMed.  Right after each signal a probe row is made due "now": the time until it
   reaches the app is the hand-over as the app sees it;
4. prints every delivery and leadership change (``Store.key_status()``) as it happens, then a
   summary and, as the last line of stdout, one JSON object: ``expected``, ``fired``, ``lost``,
   ``duplicates``, ``handover_ms``.

Exit status 0 only when nothing was lost and the plan ran to its end; 1 otherwise (an
unexplained duplicate is reported, in the JSON too, but does not change the status); 130 when
interrupted.  Everything started is stopped on every exit path, Ctrl-C included.

Run from the repository root: ``.venv/bin/python -m hack.demo`` (or ``.venv/bin/python
hack/demo.py``).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import statistics
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `python hack/demo.py` puts hack/, not the root, on the path
    sys.path.insert(0, str(REPO))

from chaos.config import ChaosConfig  # noqa: E402
from chaos.local import Handover, LocalRun, RunError, Step  # noqa: E402
from chaos.plan import APP_SLOW, KILL, SIGTERM  # noqa: E402
from schedlock.core.identities import parse_slot_uid  # noqa: E402
from schedlock.core.timings import LeaseTimings  # noqa: E402
from testbed.deliveries import Delivery  # noqa: E402
from testbed.leaders import NewTerm  # noqa: E402

# --------------------------------------------------------------------------------- the plan

TARGET = "demo"
NAMESPACE = "default"
REPLICAS = 3
SIDECAR_ENV = {
    "SCHEDLOCK_LEASE_SECONDS": "5",
    "SCHEDLOCK_HEARTBEAT_SECONDS": "1",
    "SCHEDLOCK_REQUEST_TIMEOUT_SECONDS": "10",
    "SCHEDLOCK_LOG_FORMAT": "text",
    "SCHEDLOCK_LOG_LEVEL": "info",
}
ONE_SHOTS = 30
FIRST_DUE = 0.5  # seconds after t0
SPACING = 0.5
EVERY_SECONDS = 2
PLAN = (
    # The app answers after 0.6 s from here until the next signal: publish-11, due at 5.5,
    # is still in flight when its leader is killed.
    Step(5.25, APP_SLOW, 0.6),
    Step(5.75, KILL, 1.5),  # SIGKILL the publish leader; it is restarted 1.5 s later
    Step(10.75, SIGTERM, 0.0),  # SIGTERM the next one: a graceful hand-over
)
REORDER_SECONDS = 0.15  # output lags this much (terms are polled at 10 Hz): lines in time order
MARK = "schedlock-demo"  # payload key identifying rows and schedules made by this script
# The run's settings as the chaos checker needs them (its in-flight windows).
CONFIG = ChaosConfig(
    seed=0,
    targets=(TARGET,),
    replicas=REPLICAS,
    namespace=NAMESPACE,
    with_operator=False,
    timings=LeaseTimings(
        float(SIDECAR_ENV["SCHEDLOCK_LEASE_SECONDS"]),
        float(SIDECAR_ENV["SCHEDLOCK_HEARTBEAT_SECONDS"]),
    ),
    request_timeout_seconds=float(SIDECAR_ENV["SCHEDLOCK_REQUEST_TIMEOUT_SECONDS"]),
)


def clock(t: float) -> str:
    return datetime.fromtimestamp(t).strftime("%H:%M:%S.%f")[:-3]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


# --------------------------------------------------------------------------------- the printer


@dataclass
class Printer:
    """Lines in time order (each held REORDER_SECONDS: terms are read a little after they
    begin), named for a reader: ``publish-07``, ``every-2s 12:00:04``, ``at-kill``."""

    run_id: str = field(default_factory=lambda: os.urandom(4).hex())
    run: LocalRun | None = None
    names: dict[str, str] = field(default_factory=dict)  # our one-shot uid -> display name
    lines: list[tuple[float, int, str, str]] = field(default_factory=list)
    seq: Iterator[int] = field(default_factory=itertools.count)

    def say(self, tag: str, text: str, at: float | None = None) -> None:
        self.lines.append((time.time() if at is None else at, next(self.seq), tag, text))

    def flush(self, hold: float = 0.0) -> None:
        ready = time.time() - hold
        for at, _, tag, text in sorted(line for line in self.lines if line[0] <= ready):
            print(f"{clock(at)}  {tag:<6} {text}", flush=True)
        self.lines = [line for line in self.lines if line[0] > ready]

    def pump(self) -> None:
        self.flush(REORDER_SECONDS)

    # -- what the run reports

    def step(self, tag: str, text: str, at: float | None = None) -> None:
        self.say(tag, text, at)
        self.flush(0.0 if tag in ("setup", "plan", "note") else REORDER_SECONDS)

    def delivery(self, d: Delivery, previous: Delivery | None, excused: bool) -> None:
        assert self.run is not None
        late = d.arrival - ((d.scheduled or d.arrival) - self.run.offset)
        name, note = self.describe(d.uid)
        tag = "fire"
        if previous is not None and excused:
            tag, note = "again", f"  re-fired: {previous.holder} died mid-send"
        elif previous is not None:
            tag, note = "DUP", f"  DUPLICATE (first by {previous.holder})"
        self.say(tag, f"{name:<17} due +{ms(late):<7} {d.holder} term {d.term}{note}", d.arrival)

    def term(self, new: NewTerm, at: float, handover: Handover | None) -> None:
        text = f"{new.holder} leads {new.key.scheduler} (term {new.term})"
        if handover is not None:
            text += f", lock granted {ms(at - handover.fault.start)} after the {handover.signal}"
        self.say("lead", text, at)

    def exited(self, name: str, pid: int, how: str, at: float) -> None:
        self.say("exit", f"{name} (pid {pid}) ended: {how}", at)

    def describe(self, uid: str) -> tuple[str, str]:
        assert self.run is not None
        run = self.run
        probe = next((h for h in run.handovers if h.probe == uid), None)
        if probe is not None:
            return self.names[uid], f"  <- made due at the {probe.signal}"
        if uid in self.names:
            return self.names[uid], ""
        parsed = parse_slot_uid(uid)
        if run.schedule_uid and parsed is not None and parsed[0] == run.schedule_uid:
            slot = parsed[1].timestamp()  # database clock, on the @every grid
            name = f"every-{EVERY_SECONDS}s {clock(slot)[:8]}"
            if slot - run.offset <= run.t0 or slot - run.offset > run.window_end:
                return name, "  (recurring, outside window)"
            return name, "  (recurring)"
        return uid[:17], "  (not from this run)"

    def probe(self, word: str) -> tuple[str, str]:
        uid, name = f"demo-{self.run_id}-at-{word}", f"at-{word}"
        self.names[uid] = name
        return uid, name

    # -- the end

    def summary(self, v: dict[str, Any], elapsed: float, error: str | None) -> None:
        assert self.run is not None
        run = self.run
        self.flush()
        print("\n" + "-" * 30 + " summary " + "-" * 30)
        if error is not None:
            print(f"error      {error}")
        if not run.t0:
            print(f"result     FAIL: the demo did not get to schedule anything ({elapsed:.1f} s)")
            return
        probes = {h.probe for h in run.handovers}
        one_shots = [u for u in v["expected"] if u in self.names and u not in probes]
        print(
            f"expected   {len(v['expected'])} = {len(one_shots)} one-shot publishes "
            f"+ {len(probes & set(v['expected']))} probe rows made due at the signals"
        )
        print(
            f"           + {len(v['slots'])} recurring slots: the @every {EVERY_SECONDS}s slots "
            f"after {clock(run.t0)}"
        )
        if run.broke_off is None:
            print(f"           up to the last one-shot's due time {clock(run.window_end)}")
        else:
            print(f"           up to {clock(run.cutoff())}, a second before the demo broke off")
        lost = ", ".join(self.describe(u)[0] for u in v["lost"][:6])
        lost += ", ..." if len(v["lost"]) > 6 else ""
        print(
            f"fired      {v['fired']} arrived at the app at least once; "
            f"lost {len(v['lost'])}{': ' + lost if lost else ''}"
        )
        for uid in v["explained"]:
            got = run.deliveries[uid]
            print(
                f"again      {self.describe(uid)[0]} was in flight when {got[0].holder} was "
                f"killed; term {got[-1].term} re-fired it"
            )
            print("           with the same Idempotency-Key (at-least-once across a crash)")
        dups = ", ".join(self.describe(u)[0] for u in v["duplicates"])
        print(f"duplicates {len(v['duplicates'])} unexplained{': ' + dups if dups else ''}")
        if v["skipped"]:
            print(
                f"skipped    {v['skipped']} recurring slots skipped by design after the kill "
                "(the new leader fires only the latest missed slot)"
            )
        for h, measured in zip(run.handovers, v["handover_ms"], strict=True):
            granted = "?" if h.granted_after is None else ms(h.granted_after)
            seen = "never" if measured is None else f"{measured:.0f} ms"
            print(
                f"hand-over  {h.signal} {h.fault.victim} -> {h.new_leader or '?'}: lock granted "
                f"after {granted}, new term at the app after {seen}"
            )
        if run.handovers:
            print("           (handover_ms: from the signal until the next term's first delivery")
            print("           reached the app: the probe row made due at that instant, or a row")
            print("           in flight at the kill re-fired; measured at the receiver)")
        lateness = [
            got[0].arrival - (got[0].scheduled - run.offset)
            for uid, got in run.deliveries.items()
            if uid in self.names and uid not in probes and got[0].scheduled is not None
        ]
        if lateness:
            print(
                f"lateness   one-shots reached the app {ms(statistics.median(lateness))} "
                f"(median), {ms(max(lateness))} (max) after their due time"
            )
        shown = run.rundir.relative_to(REPO) if run.rundir.is_relative_to(REPO) else run.rundir
        print(f"logs       {shown}/  (sidecar logs, receiver/deliveries.jsonl)")
        if v["lost"] or error is not None:
            verdict = "FAIL: " + ("rows were lost" if v["lost"] else "the scenario broke off")
        else:
            verdict = "PASS: every expected row fired"
        if v["duplicates"]:
            verdict += "; WARNING: unexplained duplicate deliveries"
        print(f"result     {verdict} ({elapsed:.0f} s)")


# --------------------------------------------------------------------------------- the demo


def scenario(run: LocalRun, printer: Printer) -> None:
    run.start(os.environ.get("DATABASE_URL") or None)
    run.schedule(EVERY_SECONDS, {MARK: printer.run_id})
    run.t0 = time.time()
    for i in range(ONE_SHOTS):
        name = f"publish-{i + 1:02d}"
        uid = f"demo-{printer.run_id}-{name}"
        printer.names[uid] = name
        due = run.t0 + FIRST_DUE + i * SPACING
        run.publish(uid, name, due, {MARK: printer.run_id, "n": i + 1})
    last = FIRST_DUE + (ONE_SHOTS - 1) * SPACING
    run.window_end = run.t0 + last
    printer.step(
        "plan",
        f"{ONE_SHOTS} one-shot publishes due every {SPACING:g} s, +{FIRST_DUE:g} s "
        f"to +{last:g} s (store API)",
        run.t0,
    )
    run.run(PLAN, printer.probe)
    printer.flush()


def _interrupt(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


@contextlib.contextmanager
def _no_interrupts() -> Iterator[None]:
    """Clean-up must run to the end: a second Ctrl-C must not leave processes behind."""
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _rundir() -> Path:
    base = REPO / ".demo"
    base.mkdir(exist_ok=True)
    cutoff = time.time() - 3600
    for old in base.glob("run-*"):  # keep an hour of earlier runs' logs
        with contextlib.suppress(OSError):
            if old.stat().st_mtime < cutoff:
                shutil.rmtree(old, ignore_errors=True)
    path = base / f"run-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    path.mkdir()
    return path


INTRO = """\
schedlock demo: {n} sidecar replicas of app "{target}" compete for PostgreSQL advisory locks
(one per scheduler key); the leader fires due rows into the app. One leader is SIGKILLed and
the next SIGTERMed: the lock moves in milliseconds and every row still fires.
"""


def main() -> int:
    warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # even if started ignoring them
        signal.signal(sig, _interrupt)
    started = time.monotonic()
    print(INTRO.format(n=REPLICAS, target=TARGET), flush=True)
    printer = Printer()
    # A run killed hard (no clean-up) may have left its schedule active: the next one cancels it.
    leftovers = REPO / ".demo" / "active-schedules"
    run = LocalRun(_rundir(), CONFIG, SIDECAR_ENV, printer, leftovers)
    printer.run = run
    error: str | None = None
    try:
        scenario(run, printer)
    except KeyboardInterrupt:
        with _no_interrupts():
            printer.flush()
            print("\ninterrupted: stopping everything the demo started ...", flush=True)
            run.cleanup()
        print("stopped.", flush=True)
        return 130
    except RunError as exc:
        error = str(exc)
        run.broke_off = time.time()
    except Exception as exc:  # still clean up, summarise and print the JSON line
        error = f"{type(exc).__name__}: {exc}"
        run.broke_off = time.time()
    finally:
        with _no_interrupts():
            run.cleanup()
    verdict = run.verdict()
    printer.summary(verdict, time.monotonic() - started, error)
    counts = {k: len(verdict[k]) for k in ("expected", "lost", "duplicates")}
    line = {**counts, "fired": verdict["fired"], "handover_ms": verdict["handover_ms"]}
    keys = ("expected", "fired", "lost", "duplicates", "handover_ms")
    print(json.dumps({k: line[k] for k in keys}), flush=True)
    return 0 if not verdict["lost"] and error is None else 1


if __name__ == "__main__":
    sys.exit(main())
