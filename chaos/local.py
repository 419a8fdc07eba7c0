"""A chaos run small enough to watch: one database, one app, a few sidecars of one target, and a
fixed list of steps instead of a seeded plan (``make demo``: hack/demo.py is its plan and its
printer).

The run reports what happens to a :class:`Printer` as it happens: deliveries as the app logged
them (with the earlier delivery of the same row and the fault that excuses it, if any), terms
as ``Store.key_status()`` shows them (``testbed.leaders.TermWatch``), processes that ended,
and the steps it takes.  Leader faults aim at the publish key's leader at that moment; right
after the signal a probe row is made due "now", so the hand-over shows at the app.  The
verdict is the chaos checker's (``chaos.checker.check``) over the same run data.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, TypeVar

import psycopg

from chaos import checker
from chaos.checker import Fault, RunData
from chaos.config import ChaosConfig
from chaos.plan import APP_SLOW, KILL
from schedlock.core.identities import Scheduler, parse_slot_uid, slot_uid
from schedlock.store import LockKey, PublishSpec, Store, open_store
from testbed.deliveries import Delivery, DeliveryLog
from testbed.leaders import NewTerm, TermWatch, leader_of
from testbed.pg import PostgresServer
from testbed.procs import output, terminate
from testbed.sidecars import SidecarGroup, SidecarProcess, wait_for

T = TypeVar("T")
# Seconds.  key_status() reads pg_locks and asks the definer function about foreign holders:
# polled at 40 Hz it slowed a SIGTERMed leader's release (granted after 100-370 ms instead of
# 30-60 ms, the outgoing leader still firing the probe row); 10 Hz leaves the hand-over alone.
PUMP_INTERVAL, TERMS_POLL_INTERVAL = 0.01, 0.1
STARTUP_TIMEOUT, HANDOVER_TIMEOUT = 60.0, 20.0
SETTLE_TIMEOUT = 20.0  # after the last due time, how long everything expected may still take


class RunError(RuntimeError):
    """The run could not go on (a process did not start, no leader took over, ...)."""


@dataclass(frozen=True)
class Step:
    at: float  # seconds after the rows' t0
    kind: str  # chaos.plan.APP_SLOW, KILL or SIGTERM
    hold: float  # APP_SLOW: the app's answer delay, until the next signal; KILL: restart after


@dataclass
class Handover:
    fault: Fault  # as the chaos checker sees it
    process: SidecarProcess
    probe: str  # the probe row's uid
    roles: str  # "publish (term 2) and recurring (term 2)": what the victim led
    granted_after: float | None = None  # the new term's start minus the signal
    new_leader: str | None = None

    @property
    def signal(self) -> str:
        return "SIGKILL" if self.fault.kind == KILL else "SIGTERM"


class Printer(Protocol):
    def step(self, tag: str, text: str, at: float | None = None) -> None: ...
    def delivery(self, d: Delivery, previous: Delivery | None, excused: bool) -> None: ...
    def term(self, new: NewTerm, at: float, handover: Handover | None) -> None: ...
    def exited(self, name: str, pid: int, how: str, at: float) -> None: ...
    def pump(self) -> None: ...


@dataclass
class LocalRun:
    rundir: Path
    config: ChaosConfig  # one target, its namespace, replicas and timings (the checker's too)
    sidecar_env: dict[str, str]
    printer: Printer
    leftovers: Path  # uids of schedules a run killed hard may have left active
    url: str = ""
    pg: PostgresServer | None = None
    store: Store | None = None
    loop: asyncio.Runner = field(default_factory=asyncio.Runner)
    group: SidecarGroup | None = None
    schedule_uid: str | None = None
    every_seconds: int = 0
    offset: float = 0.0  # database clock minus local clock
    t0: float = 0.0
    window_end: float = 0.0
    due: dict[str, float] = field(default_factory=dict)  # one-shot uid -> due (local clock)
    broke_off: float | None = None  # when the run stopped early (an error)
    handovers: list[Handover] = field(default_factory=list)
    deliveries: dict[str, list[Delivery]] = field(default_factory=dict)
    terms: TermWatch = field(default_factory=TermWatch)
    acquisitions: list[dict[str, Any]] = field(default_factory=list)
    signalled: set[int] = field(default_factory=set)  # pids the run sent a signal to
    exited: set[int] = field(default_factory=set)
    log: DeliveryLog | None = None
    polled_at: float = 0.0

    @property
    def target(self) -> str:
        return self.config.targets[0]

    @property
    def publish_key(self) -> LockKey:
        return LockKey(Scheduler.PUBLISH, self.config.namespace, self.target)

    @property
    def db(self) -> Store:
        assert self.store is not None
        return self.store

    @property
    def sidecars(self) -> list[SidecarProcess]:
        return self.group.sidecars if self.group is not None else []

    def call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self.loop.run(coroutine)

    def cli(self, *args: str) -> str:
        program = Path(sys.executable).parent / "schedlock"
        env = {**os.environ, "SCHEDLOCK_DATABASE_URL": self.url}
        what = f"schedlock {args[0]}"
        return output([str(program), *args], what, error=RunError, env=env, timeout=60)

    # -- watching ------------------------------------------------------------------------------

    def pump(self) -> None:
        """Report what happened since the last call: deliveries, new terms, ended processes."""
        if self.group is not None and self.group.receiver is not None:
            self.log = self.log or DeliveryLog(self.group.receiver.log_path)
            for d in self.log.appended():
                earlier = self.deliveries.setdefault(d.uid, [])
                previous = earlier[-1] if earlier else None
                faults = [h.fault for h in self.handovers]
                excused = previous is not None and bool(
                    checker.refire_excused(faults, self.config, previous, d)
                )
                earlier.append(d)
                self.printer.delivery(d, previous, excused)
        if time.time() - self.polled_at >= TERMS_POLL_INTERVAL:
            self.polled_at = time.time()
            self.poll_terms()
        for sidecar in self.sidecars:
            proc = sidecar.process
            if proc is None or proc.pid in self.exited or (code := proc.poll()) is None:
                continue
            self.exited.add(proc.pid)
            how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
            self.printer.exited(sidecar.name, proc.pid, how, time.time())
            if proc.pid not in self.signalled:
                tail = "\n".join(sidecar.log_text().splitlines()[-10:])
                raise RunError(f"{sidecar.name} died on its own ({how}); its log ends:\n{tail}")
        self.printer.pump()

    def poll_terms(self, news: bool = True) -> None:
        statuses = [s for s in self.call(self.db.key_status()) if s.target == self.target]
        for new in self.terms.look(statuses):
            at = (new.since or time.time() + self.offset) - self.offset
            self.acquisitions.append({"key": str(new.key), "ts": at, "term": new.term})
            cause = next(
                (
                    h
                    for h in reversed(self.handovers)
                    if h.fault.victim == new.previous != new.holder and at >= h.fault.start
                ),
                None,
            )
            if cause is not None and new.key == self.publish_key and cause.granted_after is None:
                cause.granted_after, cause.new_leader = at - cause.fault.start, new.holder
            if news:
                self.printer.term(new, at, cause)

    def leader(self, key: LockKey) -> str | None:
        status = self.terms.keys.get(key)
        return None if status is None else leader_of(status)

    def wait(self, predicate: Callable[[], Any], timeout: float, what: str) -> None:
        def pumped() -> Any:
            self.pump()
            return predicate()

        try:
            wait_for(pumped, timeout, PUMP_INTERVAL, what)
        except TimeoutError as exc:
            raise RunError(str(exc)) from None

    def sleep_until(self, moment: float) -> None:
        while time.time() < moment:
            self.pump()
            time.sleep(min(PUMP_INTERVAL, max(0.0, moment - time.time())))

    # -- set-up --------------------------------------------------------------------------------

    def start(self, database_url: str | None) -> None:
        """The database (``database_url``, or an embedded one), the schema, the app and the
        sidecars, until both keys are led."""
        say = self.printer.step
        if database_url:
            self.url = database_url
            say("setup", "using the PostgreSQL at $DATABASE_URL")
        else:
            self.pg = PostgresServer(self.rundir / "postgres")
            self.pg.start(timeout=STARTUP_TIMEOUT)
            self.url = self.pg.url()
            say("setup", f"embedded PostgreSQL on 127.0.0.1:{self.pg.port}")
        self.cli("migrate")
        self.store = open_store(self.url, application_name="schedlock-demo", pool_size=1)
        with psycopg.connect(self.url, connect_timeout=10) as conn:  # the server's clock
            before = time.time()
            row = conn.execute(
                "SELECT extract(epoch FROM clock_timestamp())::float8, "
                "current_setting('server_version')"
            ).fetchone()
            assert row is not None
            self.offset = float(row[0]) - (before + time.time()) / 2
        if abs(self.offset) > 0.05:
            say("note", f"database clock is {self.offset * 1000:.0f} ms ahead of this machine's")
        say("setup", f"schema migrated (PostgreSQL {row[1]})")
        left = self.leftovers.read_text().split() if self.leftovers.exists() else []
        active = [
            u for u in left if (s := self.call(self.db.get_schedule(u))) and s.state == "active"
        ]
        self.cancel(active, [])
        if active:
            say("setup", f"cancelled {len(active)} schedule(s) left by an earlier demo run")
        self.poll_terms(news=False)  # what an earlier run left
        self.group = SidecarGroup(
            self.rundir,
            self.url,
            target=self.target,
            namespace=self.config.namespace,
            replicas=self.config.replicas,
            extra_env=self.sidecar_env,
        )
        self.group.start(wait_ready=False)
        assert self.group.receiver is not None
        say("setup", f"app (recording receiver) listening on {self.group.receiver.url}")
        for sidecar in self.sidecars:
            self.wait(sidecar.ready, STARTUP_TIMEOUT, f"{sidecar.name} to be ready")
        t = self.config.timings
        say(
            "setup",
            f"{len(self.sidecars)} sidecars ready ({', '.join(s.name for s in self.sidecars)}): "
            f"lease {t.lease_seconds:g} s, heartbeat {t.heartbeat_seconds:g} s",
        )
        keys = [LockKey(s, self.config.namespace, self.target) for s in Scheduler]
        self.wait(lambda: all(self.leader(k) for k in keys), STARTUP_TIMEOUT, "first leaders")

    def schedule(self, every_seconds: int, payload: dict[str, Any]) -> None:
        """An ``@every`` schedule through the CLI, until the recurring leader has planned it."""
        expression = f"@every {every_seconds}s"
        out = self.cli(
            *("schedule", "--target", self.target, "--namespace", self.config.namespace),
            *("--cron", expression, "--name", f"every-{every_seconds}s"),
            *("--payload", json.dumps(payload)),
        )
        self.schedule_uid = uid = str(json.loads(out.splitlines()[-1])["uid"])
        self.every_seconds = every_seconds
        self.leftovers.write_text(uid + "\n")
        self.printer.step(
            "plan", f"schedlock schedule --target {self.target} --cron '{expression}'"
        )

        def planned() -> bool:
            record = self.call(self.db.get_schedule(uid))
            return record is not None and record.next_slot_at is not None

        self.wait(planned, HANDOVER_TIMEOUT, "the recurring leader to plan the schedule")

    def publish(self, uid: str, name: str, due: float, payload: dict[str, Any]) -> None:
        """A one-shot row due at ``due`` (local clock), through the store's ``upsert_publish``."""
        self.due[uid] = due
        spec = PublishSpec(
            namespace=self.config.namespace,
            name=name,
            uid=uid,
            target=self.target,
            due_at=datetime.fromtimestamp(due + self.offset, UTC),
            payload=payload,
        )
        self.call(self.db.upsert_publish(spec))

    # -- the steps -----------------------------------------------------------------------------

    def run(self, plan: tuple[Step, ...], probe: Callable[[str], tuple[str, str]]) -> None:
        """Carry out ``plan`` from ``t0``; ``probe(word)`` names the probe row of a signal
        (uid, name).  Then wait until every expected row has arrived."""
        slow = False
        assert self.group is not None
        assert self.group.receiver is not None
        for step in plan:
            self.sleep_until(self.t0 + step.at)
            if step.kind == APP_SLOW:
                self.group.receiver.control(delay=step.hold)
                self.printer.step(
                    "app", f"the app now answers after {step.hold:g} s (a slow moment)"
                )
                slow = True
                continue
            handover = self.hand_over(step.kind, probe)
            if slow:
                self.group.receiver.control(delay=0)
                slow = False
            self.wait_new_leader(handover)
            victim = handover.process.name
            if step.kind == KILL:
                self.sleep_until(handover.fault.start + step.hold)
                handover.process.start()
                self.printer.step(
                    "start", f"{victim} restarted (as Kubernetes would); it joins the queue"
                )
            else:
                self.wait_exit(handover.process)
        self.sleep_until(self.window_end + 0.5)
        expected = self.expected_uids()
        if missing := [uid for uid in expected if uid not in self.deliveries]:
            self.printer.step("wait", f"{len(missing)} expected deliveries still missing; waiting")
        self.wait(
            lambda: all(u in self.deliveries for u in expected),
            SETTLE_TIMEOUT,
            "every expected delivery",
        )
        self.sleep_until(time.time() + 0.3)  # a late duplicate would show up here

    def wait_new_leader(self, handover: Handover) -> None:
        def taken_over() -> bool:
            return self.leader(self.publish_key) not in (None, handover.fault.victim)

        self.wait(taken_over, HANDOVER_TIMEOUT, f"a new publish leader after the {handover.signal}")

    def wait_exit(self, process: SidecarProcess) -> None:
        self.wait(lambda: not process.alive(), HANDOVER_TIMEOUT, f"{process.name} to exit")

    def hand_over(self, kind: str, probe: Callable[[str], tuple[str, str]]) -> Handover:
        """Signal the publish leader (SIGKILL or SIGTERM) and make the probe row due now."""
        self.wait(lambda: self.leader(self.publish_key), HANDOVER_TIMEOUT, "a publish leader")
        victim = next(s for s in self.sidecars if s.name == self.leader(self.publish_key))
        led = sorted(
            (k for k, s in self.terms.keys.items() if leader_of(s) == victim.name), key=str
        )
        roles = " and ".join(f"{k.scheduler} (term {self.terms.keys[k].term})" for k in led)
        self.pump()  # report what arrived before the signal first
        assert victim.process is not None
        sig = signal.SIGKILL if kind == KILL else signal.SIGTERM
        uid, name = probe(sig.name[3:].lower())
        sent = time.time()
        fault = Fault(kind, sent, sent, victim.name, frozenset(str(k) for k in led))
        handover = Handover(fault, victim, uid, roles)
        self.signalled.add(victim.process.pid)
        victim.process.send_signal(sig)
        self.handovers.append(handover)
        self.publish(uid, name, sent, {})
        self.printer.step(
            "KILL" if kind == KILL else "TERM", f"{sig.name} {victim.name}, leader of {roles}", sent
        )
        self.printer.step("probe", f"row {name} made due now: who fires it, and when?")
        return handover

    # -- the verdict ---------------------------------------------------------------------------

    def cutoff(self) -> float:
        """The last one-shot's due time, or a second before the run broke off."""
        if self.broke_off is None:
            return self.window_end
        return min(self.window_end, self.broke_off - 1.0)

    def expected_slots(self) -> list[str]:
        """``@every`` slots lie on a grid from the epoch: those in (t0, cutoff]."""
        if self.schedule_uid is None or not self.t0:
            return []
        start, end, every = self.t0 + self.offset, self.cutoff() + self.offset, self.every_seconds
        first = (int(start) // every + 1) * every
        slots = [s for s in range(first, int(end) + 1, every) if start < s <= end]
        return [slot_uid(self.schedule_uid, datetime.fromtimestamp(s, UTC)) for s in slots]

    def expected_uids(self) -> list[str]:
        return [u for u in self.due if self.due[u] <= self.cutoff()] + self.expected_slots()

    def verdict(self) -> dict[str, Any]:
        """The chaos checker's verdict over what the app received: the rows expected, how many
        fired, lost, doubled (unexplained, or excused by a crash), the recurring slots skipped
        by design, and per hand-over the ms until the new term's first delivery."""
        one_shots = [u for u in self.due if self.due[u] <= self.cutoff()]
        slots = self.expected_slots()
        schedules = {}
        if self.schedule_uid is not None and slots and (first := parse_slot_uid(slots[0])):
            schedules[self.schedule_uid] = {
                "target": self.target,
                "first_slot": first[1].timestamp(),
                "every_seconds": self.every_seconds,
            }
        entries = sorted((e for got in self.deliveries.values() for e in got), key=_arrival)
        data = RunData(
            config=self.config,
            t0=self.t0,
            t_end=self.cutoff() + self.offset,
            expected={
                u: {"kind": "row", "target": self.target, "due": self.due[u]} for u in one_shots
            },
            schedules=schedules,
            entries=entries,
            faults=[h.fault for h in self.handovers],
            db={},
            stepdowns=[],
            acquisitions=sorted(self.acquisitions, key=lambda a: float(a["ts"])),
        )
        report = checker.check(data)[1]
        recurring, expected = report["recurring"], one_shots + slots
        missed = [
            slot_uid(m["schedule"], datetime.fromtimestamp(m["slot"], UTC))
            for m in recurring["missed"]
        ]
        duplicates = {d["uid"] for d in report["duplicates_without_crash"]} & set(expected)
        excused = {d["uid"] for d in report["duplicates_excused"]} & set(expected) - duplicates
        key = str(self.publish_key)
        publish = [e for e in entries if checker.lock_key(e, self.config.namespace) == key]
        handover_ms: list[float | None] = []
        for h in self.handovers:
            first_new = checker.first_new_term_arrival(publish, h.fault.start)
            handover_ms.append(
                None if first_new is None else round((first_new - h.fault.start) * 1000, 1)
            )
        return {
            "expected": expected,
            "slots": slots,
            "fired": len(one_shots) - len(report["lost"]) + recurring["delivered_slots"],
            "lost": [d["uid"] for d in report["lost"]] + missed,
            "duplicates": sorted(duplicates),
            "explained": sorted(excused),
            "skipped": recurring["skipped_by_outage"],
            "handover_ms": handover_ms,
        }

    # -- clean-up ------------------------------------------------------------------------------

    def cancel(self, schedules: list[str], publishes: list[str]) -> None:
        for uid in schedules:
            self.call(self.db.cancel_schedule(uid))
        for uid in publishes:
            self.call(self.db.cancel_publish(uid))

    def cleanup(self) -> None:
        """Cancel what may still fire, stop every process started, remove the embedded
        database; safe to call again."""
        if self.store is not None:
            try:
                undelivered = [u for u in self.due if u not in self.deliveries]
                self.cancel([self.schedule_uid] if self.schedule_uid else [], undelivered)
                self.leftovers.unlink(missing_ok=True)
                self.call(self.db.close())
            except Exception as exc:  # clean-up goes on
                print(f"clean-up: {type(exc).__name__}: {exc}", file=sys.stderr)
            self.store = None
        self.loop.close()
        for sidecar in self.sidecars:  # all at once: each may take its shutdown grace
            sidecar.signal(signal.SIGTERM)
        for sidecar in self.sidecars:
            terminate(sidecar.process, 15)
        if self.group is not None and self.group.receiver is not None:
            with contextlib.suppress(Exception):
                self.group.receiver.stop()
        if self.pg is not None:
            with contextlib.suppress(Exception):
                self.pg.stop("fast")
            self.pg.destroy()
            self.pg = None


def _arrival(entry: Delivery) -> float:
    return entry.arrival
