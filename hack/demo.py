"""``make demo``: three sidecar replicas, one leader, two hand-overs, nothing lost.

Needs only Python (the project's ``.venv``): an embedded PostgreSQL is started under ``.demo/``
unless ``DATABASE_URL`` points at one (a role that may create the schema).  The demo

1. migrates the schema (``schedlock migrate``), starts the recording app
   (``testbed.receiver``) and three ``schedlock sidecar`` replicas of app ``demo`` in
   namespace ``default`` (lease 5 s, heartbeat 1 s; their text logs go to ``.demo/run-*/``);
2. creates a recurring schedule (``schedlock schedule --cron '@every 2s'``) and 30 one-shot
   publishes due every 0.5 s over 15 s (through the store API, ``upsert_publish``);
3. SIGKILLs the publish leader about 5.75 s in, while the app is answering slowly so that a
   delivery is in flight (the next leader re-fires it with the same Idempotency-Key), restarts
   the killed replica as Kubernetes would, and SIGTERMs the next publish leader about 10.75 s
   in.  Right after each signal a probe row is made due "now": the time until it reaches the
   app is the hand-over as the app sees it;
4. prints every delivery and leadership change as it happens, then a summary and, as the last
   line of stdout, one JSON object: ``expected``, ``fired``, ``lost``, ``duplicates``,
   ``handover_ms``.

Exit status 0 only when nothing was lost and the scenario ran to its end; 1 otherwise (an
unexplained duplicate is reported, in the JSON too, but does not change the status); 130 when
interrupted.  Everything started is stopped on every exit path, Ctrl-C included.

Run from the repository root: ``.venv/bin/python -m hack.demo`` (or ``.venv/bin/python
hack/demo.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

import psycopg

from schedlock.store import PublishSpec, open_store

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `python hack/demo.py` puts hack/, not the root, on the path
    sys.path.insert(0, str(REPO))

from chaos import checker  # noqa: E402
from chaos.checker import Fault, RunData  # noqa: E402
from chaos.config import ChaosConfig  # noqa: E402
from chaos.plan import KILL, SIGTERM  # noqa: E402
from schedlock.core.identities import Scheduler, parse_slot_uid, slot_uid  # noqa: E402
from schedlock.core.timings import LeaseTimings  # noqa: E402
from testbed.deliveries import Delivery, DeliveryLog  # noqa: E402
from testbed.pg import PostgresServer, server_dir  # noqa: E402
from testbed.procs import output  # noqa: E402
from testbed.sidecars import ReceiverProcess, SidecarProcess, wait_for  # noqa: E402

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
KILL_AT = 5.75  # publish-11 is due at 5.5 and still in flight (slow app) when the leader dies
SLOW_APP_AT = 5.25  # the app answers after SLOW_APP_SECONDS from here until the kill
SLOW_APP_SECONDS = 0.6
RESTART_AFTER = 1.5  # the killed replica comes back (as Kubernetes would restart it)
TERM_AT = 10.75
SETTLE_TIMEOUT = 20.0  # after the last due time, how long everything expected may still take
STARTUP_TIMEOUT = 60.0
HANDOVER_TIMEOUT = 20.0
PUMP_INTERVAL = 0.01
TERMS_POLL_INTERVAL = 0.025
REORDER_SECONDS = 0.1  # output lags this much so that lines come out in time order

_MARK = "schedlock-demo"  # payload key identifying rows and schedules made by this script
# The chaos checker judges the demo's deliveries too: its in-flight windows need these.
CHECKER_CONFIG = ChaosConfig(
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


class DemoError(RuntimeError):
    """The scenario could not go on (a process did not start, no leader took over, ...)."""


def clock(t: float) -> str:
    return datetime.fromtimestamp(t).strftime("%H:%M:%S.%f")[:-3]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def schedlock_bin() -> str:
    candidate = Path(sys.executable).parent / "schedlock"
    return str(candidate) if candidate.exists() else "schedlock"


# --------------------------------------------------------------------------------- records


@dataclass
class KeyState:
    term: int
    holder: str | None
    since: float | None  # database clock
    released: float | None


@dataclass
class Handover:
    signal: str  # "SIGKILL" or "SIGTERM"
    victim: str
    process: SidecarProcess
    sent_at: float  # local clock
    probe_uid: str
    keys: frozenset[str]  # the lock keys the victim led
    granted_after: float | None = None  # new term's start minus the signal
    new_leader: str | None = None

    @property
    def fault(self) -> Fault:
        """As the chaos checker sees it (a SIGTERM excuses nothing: it is graceful)."""
        kind = KILL if self.signal == "SIGKILL" else SIGTERM
        return Fault(kind, self.sent_at, self.sent_at, self.victim, self.keys)


@dataclass
class Outcome:
    expected: list[str]
    expected_slots: list[str]
    fired: int
    lost: list[str]
    duplicates: list[str]
    explained: list[str]
    handover_ms: list[float | None]
    skipped: int  # recurring slots skipped by design after an outage (the checker's rule)


# --------------------------------------------------------------------------------- the demo


@dataclass
class Demo:
    rundir: Path
    database_url: str | None  # None: start an embedded PostgreSQL
    url: str = ""
    pg: PostgresServer | None = None
    conn: psycopg.Connection[tuple[Any, ...]] | None = None
    receiver: ReceiverProcess | None = None
    sidecars: list[SidecarProcess] = field(default_factory=list)  # every process started
    schedule_uid: str | None = None
    offset: float = 0.0  # database clock minus local clock
    t0: float = 0.0
    window_end: float = 0.0
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    names: dict[str, str] = field(default_factory=dict)  # our one-shot uid -> display name
    due: dict[str, float] = field(default_factory=dict)  # our one-shot uid -> due (local clock)
    broke_off: float | None = None  # when the scenario stopped early (an error)
    probes: dict[str, Handover] = field(default_factory=dict)  # probe uid -> its hand-over
    handovers: list[Handover] = field(default_factory=list)
    deliveries: dict[str, list[Delivery]] = field(default_factory=dict)
    keys: dict[str, KeyState] = field(default_factory=dict)
    acquisitions: list[dict[str, Any]] = field(default_factory=list)  # for the checker
    signalled: set[int] = field(default_factory=set)  # pids we sent a signal to
    exited: set[int] = field(default_factory=set)
    _lines: list[tuple[float, int, str, str]] = field(default_factory=list)
    _seq: Iterator[int] = field(default_factory=itertools.count)
    _log: DeliveryLog | None = None
    _last_terms_poll: float = 0.0
    _cleaned: bool = False

    # ---------------------------------------------------------------- output

    def say(self, tag: str, text: str, at: float | None = None) -> None:
        """Queue a line; lines are printed in time order once they are REORDER_SECONDS old."""
        self._lines.append((time.time() if at is None else at, next(self._seq), tag, text))
        self.flush(REORDER_SECONDS)

    def announce(self, tag: str, text: str, at: float | None = None) -> None:
        """A line about a step the demo takes: printed at once."""
        self.say(tag, text, at)
        self.flush()

    def flush(self, hold: float = 0.0) -> None:
        """Print queued lines older than ``hold`` seconds (leadership changes are read from
        the database a little after they happen, deliveries from the app's log at once)."""
        ready = time.time() - hold
        due = sorted(line for line in self._lines if line[0] <= ready)
        self._lines = [line for line in self._lines if line[0] > ready]
        for at, _, tag, text in due:
            print(f"{clock(at)}  {tag:<6} {text}", flush=True)

    # ---------------------------------------------------------------- set-up

    def start_database(self) -> None:
        if self.database_url:
            self.url = self.database_url
            self.announce("setup", "using the PostgreSQL at $DATABASE_URL")
        else:
            self.pg = PostgresServer(self.rundir / "postgres")
            self.pg.start(timeout=STARTUP_TIMEOUT)
            self.url = self.pg.url()
            self.announce("setup", f"embedded PostgreSQL on 127.0.0.1:{self.pg.port}")
        self.cli("migrate")
        self.conn = psycopg.connect(self.url, autocommit=True, connect_timeout=10)
        before = time.time()
        row = self.conn.execute(
            "SELECT extract(epoch FROM clock_timestamp())::float8, "
            "current_setting('server_version')"
        ).fetchone()
        after = time.time()
        assert row is not None
        self.offset = float(row[0]) - (before + after) / 2
        if abs(self.offset) > 0.05:
            self.announce("note", f"database clock is {ms(self.offset)} ahead of this machine's")
        self.announce("setup", f"schema migrated (PostgreSQL {row[1]})")
        self.cancel_leftovers()

    def cli(self, *args: str) -> str:
        env = {**os.environ, "SCHEDLOCK_DATABASE_URL": self.url}
        return output(
            [schedlock_bin(), *args], f"schedlock {args[0]}", error=DemoError, env=env, timeout=60
        )

    def cancel_leftovers(self) -> None:
        """A demo killed hard (no clean-up) may have left its schedule active: cancel it."""
        assert self.conn is not None
        rows = self.conn.execute(
            "SELECT uid FROM schedlock_schedules WHERE namespace = %s AND target = %s "
            "AND state = 'active' AND payload ? %s",
            (NAMESPACE, TARGET, _MARK),
        ).fetchall()
        for (uid,) in rows:
            asyncio.run(_cancel(self.url, schedules=[str(uid)], publishes=[]))
        if rows:
            self.announce("setup", f"cancelled {len(rows)} schedule(s) left by an earlier demo run")

    def start_processes(self) -> None:
        self._poll_terms()  # what an earlier run left: not news
        initial = {s: k.term for s, k in self.keys.items()}
        self.receiver = ReceiverProcess(self.rundir / "receiver")
        self.receiver.start()
        self.announce("setup", f"app (recording receiver) listening on {self.receiver.url}")
        for i in range(REPLICAS):
            self.start_sidecar(f"{TARGET}-{i}")
        started = time.monotonic()
        for sidecar in list(self.sidecars):
            left = max(5.0, STARTUP_TIMEOUT - (time.monotonic() - started))
            self.wait(sidecar.ready, left, f"{sidecar.name} to be ready")
        self.announce(
            "setup",
            f"{REPLICAS} sidecars ready ({', '.join(s.name for s in self.sidecars)}): "
            "lease 5 s, heartbeat 1 s",
        )

        def led(scheduler: str) -> bool:
            key = self.keys.get(scheduler)
            return key is not None and key.term > initial.get(scheduler, 0) and not key.released

        self.wait(lambda: led("publish") and led("recurring"), STARTUP_TIMEOUT, "first leaders")

    def start_sidecar(self, name: str) -> SidecarProcess:
        assert self.receiver is not None
        env = {
            "SCHEDLOCK_DATABASE_URL": self.url,
            "SCHEDLOCK_NAMESPACE": NAMESPACE,
            "SCHEDLOCK_TARGET": TARGET,
            "SCHEDLOCK_TARGET_URL": self.receiver.url,
            **SIDECAR_ENV,
        }
        sidecar = SidecarProcess(name, self.rundir, env)
        self.sidecars.append(sidecar)  # before start(): clean-up must see it whatever happens
        sidecar.start()
        return sidecar

    def schedule(self) -> None:
        assert self.conn is not None
        payload = json.dumps({_MARK: self.run_id})
        out = self.cli(
            "schedule",
            "--target",
            TARGET,
            "--namespace",
            NAMESPACE,
            "--cron",
            f"@every {EVERY_SECONDS}s",
            "--name",
            f"every-{EVERY_SECONDS}s",
            "--payload",
            payload,
        )
        self.schedule_uid = str(json.loads(out.splitlines()[-1])["uid"])
        self.announce(
            "plan", f"schedlock schedule --target {TARGET} --cron '@every {EVERY_SECONDS}s'"
        )
        conn = self.conn

        def planned() -> bool:
            row = conn.execute(
                "SELECT next_slot_at IS NOT NULL FROM schedlock_schedules WHERE uid = %s",
                (self.schedule_uid,),
            ).fetchone()
            return bool(row and row[0])

        self.wait(planned, HANDOVER_TIMEOUT, "the recurring leader to plan the schedule")

    def publish(self) -> None:
        self.t0 = time.time()
        specs = []
        for i in range(ONE_SHOTS):
            name = f"publish-{i + 1:02d}"
            uid = f"demo-{self.run_id}-{name}"
            self.names[uid] = name
            self.due[uid] = self.t0 + FIRST_DUE + i * SPACING
            due = self.due[uid] + self.offset
            specs.append(
                PublishSpec(
                    namespace=NAMESPACE,
                    name=name,
                    uid=uid,
                    target=TARGET,
                    due_at=datetime.fromtimestamp(due, UTC),
                    payload={_MARK: self.run_id, "n": i + 1},
                )
            )
        asyncio.run(_upsert(self.url, specs))
        last = FIRST_DUE + (ONE_SHOTS - 1) * SPACING
        self.window_end = self.t0 + last
        self.announce(
            "plan",
            f"{ONE_SHOTS} one-shot publishes due every {SPACING:g} s, +{FIRST_DUE:g} s "
            f"to +{last:g} s (store API)",
            self.t0,
        )

    # ---------------------------------------------------------------- watching

    def pump(self) -> None:
        """Read what happened since the last call and print it in time order."""
        events: list[tuple[float, str, str]] = []
        events += self._read_deliveries()
        now = time.time()
        if now - self._last_terms_poll >= TERMS_POLL_INTERVAL:
            self._last_terms_poll = now
            events += self._poll_terms()
        events += self._poll_processes()
        for at, tag, text in events:
            self.say(tag, text, at)
        self.flush(REORDER_SECONDS)

    def wait(self, predicate: Callable[[], Any], timeout: float, what: str) -> None:
        def pumped() -> Any:
            self.pump()
            return predicate()

        try:
            wait_for(pumped, timeout, PUMP_INTERVAL, what)
        except TimeoutError as exc:
            raise DemoError(str(exc)) from None

    def sleep_until(self, moment: float) -> None:
        while time.time() < moment:
            self.pump()
            time.sleep(min(PUMP_INTERVAL, max(0.0, moment - time.time())))

    def _read_deliveries(self) -> list[tuple[float, str, str]]:
        if self.receiver is None:
            return []
        if self._log is None:
            self._log = DeliveryLog(self.receiver.log_path)
        return [self._on_delivery(d) for d in self._log.appended()]

    def _on_delivery(self, d: Delivery) -> tuple[float, str, str]:
        earlier = self.deliveries.setdefault(d.uid, [])
        earlier.append(d)
        late = d.arrival - ((d.scheduled or d.arrival) - self.offset)
        name, note = self.describe(d.uid)
        tag = "fire"
        if len(earlier) > 1:
            previous = earlier[-2]
            if self.explained(previous, d):
                tag, note = "again", f"  re-fired: {previous.holder} died mid-send"
            else:
                tag, note = "DUP", f"  DUPLICATE (first by {previous.holder})"
        return d.arrival, tag, f"{name:<17} due +{ms(late):<7} {d.holder} term {d.term}{note}"

    def describe(self, uid: str) -> tuple[str, str]:
        if uid in self.probes:
            return self.names[uid], f"  <- made due at the {self.probes[uid].signal}"
        if uid in self.names:
            return self.names[uid], ""
        parsed = parse_slot_uid(uid)
        if self.schedule_uid and parsed is not None and parsed[0] == self.schedule_uid:
            slot = parsed[1].timestamp()  # database clock, on the @every grid
            name = f"every-{EVERY_SECONDS}s {clock(slot)[:8]}"
            if slot - self.offset <= self.t0 or slot - self.offset > self.window_end:
                return name, "  (recurring, outside window)"
            return name, "  (recurring)"
        return uid[:17], "  (not from this run)"

    def explained(self, previous: Delivery, again: Delivery) -> bool:
        """The chaos checker's rule: a re-delivery is expected only with the same key, from a
        later term, when ``previous`` was in flight as its term was SIGKILLed."""
        faults = [h.fault for h in self.handovers]
        return checker.refire_excused(faults, CHECKER_CONFIG, previous, again) is not None

    def _poll_terms(self) -> list[tuple[float, str, str]]:
        if self.conn is None:
            return []
        rows = self.conn.execute(
            "SELECT scheduler, term, holder, extract(epoch FROM since)::float8, "
            "extract(epoch FROM released_at)::float8 FROM schedlock_terms "
            "WHERE namespace = %s AND target = %s",
            (NAMESPACE, TARGET),
        ).fetchall()
        events = []
        for scheduler, term, holder, since, released in rows:
            new = KeyState(int(term), holder, since, released)
            old = self.keys.get(scheduler)
            self.keys[scheduler] = new
            if new.term == 0 or new.holder is None:
                continue  # registered, never led
            if old is None or new.term > old.term:
                at = (new.since or time.time() + self.offset) - self.offset
                key = f"{scheduler}/{NAMESPACE}/{TARGET}"
                self.acquisitions.append({"key": key, "ts": at, "term": new.term})
                previous = None if old is None else old.holder
                events.append((at, "lead", self._lead_text(scheduler, new, previous, at)))
        return events

    def _lead_text(self, scheduler: str, key: KeyState, previous: str | None, at: float) -> str:
        text = f"{key.holder} leads {scheduler} (term {key.term})"
        for h in reversed(self.handovers):
            if h.victim == previous and key.holder != h.victim and at >= h.sent_at:
                if scheduler == "publish" and h.granted_after is None:
                    h.granted_after, h.new_leader = at - h.sent_at, key.holder
                return f"{text}, lock granted {ms(at - h.sent_at)} after the {h.signal}"
        return text

    def _poll_processes(self) -> list[tuple[float, str, str]]:
        events = []
        for sidecar in self.sidecars:
            proc = sidecar.process
            if proc is None or proc.pid in self.exited:
                continue
            code = proc.poll()
            if code is None:
                continue
            self.exited.add(proc.pid)
            how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
            events.append((time.time(), "exit", f"{sidecar.name} (pid {proc.pid}) ended: {how}"))
            if proc.pid not in self.signalled:
                tail = "\n".join(sidecar.log_text().splitlines()[-10:])
                raise DemoError(f"{sidecar.name} died on its own ({how}); its log ends:\n{tail}")
        return events

    # ---------------------------------------------------------------- the scenario

    def leader(self, scheduler: str = Scheduler.PUBLISH) -> SidecarProcess:
        def leaders() -> list[SidecarProcess]:
            return [s for s in self.sidecars if s.alive() and s.leads(scheduler)]

        found: list[SidecarProcess] = []

        def one() -> bool:
            found[:] = leaders()
            return len(found) == 1

        self.wait(one, HANDOVER_TIMEOUT, f"exactly one {scheduler} leader")
        return found[0]

    def hand_over(self, sig: signal.Signals) -> Handover:
        victim = self.leader(Scheduler.PUBLISH)
        metrics = victim.metrics()
        led = [s for s in Scheduler if _gauge(metrics, "schedlock_leader", s) == 1]
        keys = frozenset(f"{s}/{NAMESPACE}/{TARGET}" for s in led)
        roles = " and ".join(f"{s} (term {int(_gauge(metrics, 'schedlock_term', s))})" for s in led)
        self.pump()  # print what arrived before the signal first
        assert victim.process is not None
        assert self.conn is not None
        probe = f"demo-{self.run_id}-at-{sig.name[3:].lower()}"
        self.names[probe] = f"at-{sig.name[3:].lower()}"
        handover = Handover(sig.name, victim.name, victim, time.time(), probe, keys)
        self.due[probe] = handover.sent_at
        self.signalled.add(victim.process.pid)
        victim.process.send_signal(sig)
        self.handovers.append(handover)
        self.probes[probe] = handover
        self.conn.execute(
            "INSERT INTO schedlock_publishes (scheduler, namespace, name, uid, target, due_at, "
            "next_attempt_at, payload) VALUES ('publish', %s, %s, %s, %s, now(), now(), %s)",
            (NAMESPACE, self.names[probe], probe, TARGET, json.dumps({_MARK: self.run_id})),
        )
        self.say(
            "KILL" if sig is signal.SIGKILL else "TERM",
            f"{sig.name} {victim.name}, leader of {roles}",
            handover.sent_at,
        )
        self.say("probe", f"row {self.names[probe]} made due now: who fires it, and when?")
        return handover

    def wait_new_leader(self, handover: Handover) -> None:
        def taken_over() -> bool:
            key = self.keys.get("publish")
            return key is not None and key.holder != handover.victim and key.released is None

        self.wait(taken_over, HANDOVER_TIMEOUT, f"a new publish leader after the {handover.signal}")

    def scenario(self) -> None:
        t0 = self.t0
        self.sleep_until(t0 + SLOW_APP_AT)
        assert self.receiver is not None
        self.receiver.control(delay=SLOW_APP_SECONDS)
        self.say("app", f"the app now answers after {SLOW_APP_SECONDS:g} s (a slow moment)")
        self.sleep_until(t0 + KILL_AT)
        killed = self.hand_over(signal.SIGKILL)
        self.receiver.control(delay=0)
        self.wait_new_leader(killed)
        self.sleep_until(killed.sent_at + RESTART_AFTER)
        restarted = self.start_sidecar(killed.victim)
        self.say("start", f"{restarted.name} restarted (as Kubernetes would); it joins the queue")
        self.sleep_until(t0 + TERM_AT)
        termed = self.hand_over(signal.SIGTERM)
        self.wait_new_leader(termed)
        self.wait(lambda: not termed.process.alive(), HANDOVER_TIMEOUT, f"{termed.victim} to exit")
        self.sleep_until(self.window_end + 0.5)
        expected = self.expected_uids()
        missing = [uid for uid in expected if uid not in self.deliveries]
        if missing:
            self.say("wait", f"{len(missing)} expected deliveries still missing; waiting")
        self.wait(
            lambda: all(uid in self.deliveries for uid in expected),
            SETTLE_TIMEOUT,
            "every expected delivery",
        )
        self.sleep_until(time.time() + 0.3)  # a late duplicate would show up here
        self.flush()

    def cutoff(self) -> float:
        """The end of the counted window: the last one-shot's due time, or a second before the
        scenario broke off (rows due later never had their chance)."""
        if self.broke_off is None:
            return self.window_end
        return min(self.window_end, self.broke_off - 1.0)

    def expected_slots(self) -> list[str]:
        """``@every`` slots lie on a grid from the epoch; count those in (t0, cutoff]."""
        if self.schedule_uid is None or not self.t0:
            return []
        start = self.t0 + self.offset
        end = self.cutoff() + self.offset
        first = (int(start) // EVERY_SECONDS + 1) * EVERY_SECONDS
        slots = range(first, int(end) + 1, EVERY_SECONDS)
        return [
            slot_uid(self.schedule_uid, datetime.fromtimestamp(s, UTC))
            for s in slots
            if start < s <= end
        ]

    def expected_uids(self) -> list[str]:
        one_shots = [uid for uid in self.names if self.due[uid] <= self.cutoff()]
        return one_shots + self.expected_slots()

    # ---------------------------------------------------------------- result

    def outcome(self) -> Outcome:
        """The chaos checker's verdict over what the app received (``chaos.checker.check``)."""
        one_shots = [uid for uid in self.names if self.due[uid] <= self.cutoff()]
        slots = self.expected_slots()
        schedules = {}
        if self.schedule_uid is not None and slots:
            first = parse_slot_uid(slots[0])
            assert first is not None
            schedules[self.schedule_uid] = {
                "target": TARGET,
                "first_slot": first[1].timestamp(),
                "every_seconds": EVERY_SECONDS,
            }
        data = RunData(
            config=CHECKER_CONFIG,
            t0=self.t0,
            t_end=self.cutoff() + self.offset,
            expected={u: {"kind": "row", "target": TARGET, "due": self.due[u]} for u in one_shots},
            schedules=schedules,
            entries=sorted((e for got in self.deliveries.values() for e in got), key=_arrival),
            faults=[h.fault for h in self.handovers],
            db={},
            stepdowns=[],
            acquisitions=sorted(self.acquisitions, key=lambda a: float(a["ts"])),
        )
        _, report = checker.check(data)
        recurring = report["recurring"]
        lost = [d["uid"] for d in report["lost"]] + [
            slot_uid(m["schedule"], datetime.fromtimestamp(m["slot"], UTC))
            for m in recurring["missed"]
        ]
        expected = one_shots + slots
        duplicates = sorted({d["uid"] for d in report["duplicates_without_crash"]} & set(expected))
        explained = sorted(
            {d["uid"] for d in report["duplicates_excused"]} & set(expected) - set(duplicates)
        )
        publish_key = f"{Scheduler.PUBLISH}/{NAMESPACE}/{TARGET}"
        publish = [e for e in data.entries if checker.lock_key(e, NAMESPACE) == publish_key]
        handover_ms: list[float | None] = []
        for h in self.handovers:
            first_new = checker.first_new_term_arrival(publish, h.sent_at)
            handover_ms.append(
                None if first_new is None else round((first_new - h.sent_at) * 1000, 1)
            )
        fired = len(one_shots) - len(report["lost"]) + recurring["delivered_slots"]
        return Outcome(
            expected,
            slots,
            fired,
            lost,
            duplicates,
            explained,
            handover_ms,
            recurring["skipped_by_outage"],
        )

    def summary(self, outcome: Outcome, elapsed: float, error: str | None) -> None:
        self.flush()
        print("\n" + "-" * 30 + " summary " + "-" * 30)
        if error is not None:
            print(f"error      {error}")
        if not self.t0:
            print(f"result     FAIL: the demo did not get to schedule anything ({elapsed:.1f} s)")
            return
        slots = outcome.expected_slots
        probes = [u for u in outcome.expected if u in self.probes]
        one_shots = [u for u in outcome.expected if u in self.names and u not in self.probes]
        print(
            f"expected   {len(outcome.expected)} = {len(one_shots)} one-shot publishes "
            f"+ {len(probes)} probe rows made due at the signals"
        )
        print(
            f"           + {len(slots)} recurring slots: the @every {EVERY_SECONDS}s slots after "
            f"{clock(self.t0)}"
        )
        if self.broke_off is None:
            print(f"           up to the last one-shot's due time {clock(self.window_end)}")
        else:
            print(f"           up to {clock(self.cutoff())}, a second before the demo broke off")
        lost = ", ".join(self.describe(u)[0] for u in outcome.lost[:6])
        lost += ", ..." if len(outcome.lost) > 6 else ""
        print(
            f"fired      {outcome.fired} arrived at the app at least once; "
            f"lost {len(outcome.lost)}{': ' + lost if lost else ''}"
        )
        for uid in outcome.explained:
            got = self.deliveries[uid]
            print(
                f"again      {self.describe(uid)[0]} was in flight when {got[0].holder} was "
                f"killed; term {got[-1].term} re-fired it"
            )
            print("           with the same Idempotency-Key (at-least-once across a crash)")
        dups = ", ".join(self.describe(u)[0] for u in outcome.duplicates)
        print(f"duplicates {len(outcome.duplicates)} unexplained{': ' + dups if dups else ''}")
        if outcome.skipped:
            print(
                f"skipped    {outcome.skipped} recurring slots skipped by design after the kill "
                "(the new leader fires only the latest missed slot)"
            )
        for h, measured in zip(self.handovers, outcome.handover_ms, strict=True):
            granted = "?" if h.granted_after is None else ms(h.granted_after)
            seen = "never" if measured is None else f"{measured:.0f} ms"
            print(
                f"hand-over  {h.signal} {h.victim} -> {h.new_leader or '?'}: lock granted after "
                f"{granted}, new term at the app after {seen}"
            )
        if self.handovers:
            print("           (handover_ms: from the signal until the next term's first delivery")
            print("           reached the app: the probe row made due at that instant, or a row")
            print("           in flight at the kill re-fired; measured at the receiver)")
        lateness = [
            got[0].arrival - (got[0].scheduled - self.offset)
            for uid, got in self.deliveries.items()
            if uid in self.names and uid not in self.probes and got[0].scheduled is not None
        ]
        if lateness:
            print(
                f"lateness   one-shots reached the app {ms(statistics.median(lateness))} "
                f"(median), {ms(max(lateness))} (max) after their due time"
            )
        shown = self.rundir.relative_to(REPO) if self.rundir.is_relative_to(REPO) else self.rundir
        print(f"logs       {shown}/  (sidecar logs, receiver/deliveries.jsonl)")
        if outcome.lost or error is not None:
            verdict = "FAIL: " + ("rows were lost" if outcome.lost else "the scenario broke off")
        else:
            verdict = "PASS: every expected row fired"
        if outcome.duplicates:
            verdict += "; WARNING: unexplained duplicate deliveries"
        print(f"result     {verdict} ({elapsed:.0f} s)")

    # ---------------------------------------------------------------- clean-up

    def cleanup(self) -> None:
        if self._cleaned:
            return
        self._cleaned = True
        if self.url and self.conn is not None and not self.conn.closed:
            with contextlib.suppress(Exception):
                undelivered = [u for u in self.names if u not in self.deliveries]
                schedules = [self.schedule_uid] if self.schedule_uid else []
                asyncio.run(_cancel(self.url, schedules=schedules, publishes=undelivered))
        running = [s.process for s in self.sidecars if s.process is not None and s.alive()]
        for proc in running:  # all at once: each may take its shutdown grace
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
        for proc in running:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self.receiver is not None:
            with contextlib.suppress(Exception):
                self.receiver.stop()
        if self.conn is not None:
            with contextlib.suppress(Exception):
                self.conn.close()
        if self.pg is not None:
            with contextlib.suppress(Exception):
                self.pg.stop("fast")
            if self.pg.process is not None and self.pg.process.poll() is None:
                with contextlib.suppress(Exception):
                    self.pg.stop("immediate")
            shutil.rmtree(self.pg.datadir, ignore_errors=True)
            home = server_dir(self.pg.workdir)
            if home != self.pg.workdir:
                shutil.rmtree(home, ignore_errors=True)


# --------------------------------------------------------------------------------- helpers


async def _upsert(url: str, specs: list[PublishSpec]) -> None:
    store = open_store(url, application_name="schedlock-demo")
    try:
        for spec in specs:
            await store.upsert_publish(spec)
    finally:
        await store.close()


async def _cancel(url: str, *, schedules: list[str], publishes: list[str]) -> None:
    store = open_store(url, application_name="schedlock-demo")
    try:
        for uid in schedules:
            await store.cancel_schedule(uid)
        for uid in publishes:
            await store.cancel_publish(uid)
    finally:
        await store.close()


def _gauge(metrics: dict[str, float], name: str, scheduler: str) -> float:
    for key, value in metrics.items():
        if key.startswith(name + "{") and f'scheduler="{scheduler}"' in key:
            return value
    return 0.0


def _arrival(entry: Delivery) -> float:
    return entry.arrival


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
    demo = Demo(_rundir(), os.environ.get("DATABASE_URL") or None)
    error: str | None = None
    try:
        demo.start_database()
        demo.start_processes()
        demo.schedule()
        demo.publish()
        demo.scenario()
    except KeyboardInterrupt:
        with _no_interrupts():
            demo.flush()
            print("\ninterrupted: stopping everything the demo started ...", flush=True)
            demo.cleanup()
        print("stopped.", flush=True)
        return 130
    except DemoError as exc:
        error = str(exc)
        demo.broke_off = time.time()
    except Exception as exc:  # still clean up, summarise and print the JSON line
        error = f"{type(exc).__name__}: {exc}"
        demo.broke_off = time.time()
    finally:
        with _no_interrupts():
            demo.cleanup()
    outcome = demo.outcome()
    demo.summary(outcome, time.monotonic() - started, error)
    print(
        json.dumps(
            {
                "expected": len(outcome.expected),
                "fired": outcome.fired,
                "lost": len(outcome.lost),
                "duplicates": len(outcome.duplicates),
                "handover_ms": outcome.handover_ms,
            }
        ),
        flush=True,
    )
    return 0 if not outcome.lost and error is None else 1


if __name__ == "__main__":
    sys.exit(main())
