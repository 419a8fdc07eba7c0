"""The seeded fault schedule (pure: the same seed and duration give the same plan).

Two lanes run side by side:

* **infrastructure** faults, one at a time with a pause after each: every kind appears once
  per round, in a shuffled order, so even a 2-minute run sees each kind at least once;
* **app** faults (5xx, hang, slow answers) on one target's app, which may overlap an
  infrastructure fault.

A planned fault names its kind, when it starts (seconds after the load started), how long it
holds (the freeze, the partition, the database downtime, the restart delay, the app fault) and
which lock key it aims at; *who* is hit is decided when it runs (the current leader of that
key), so a replay with the same seed runs the same plan against the same kind of victim, not
necessarily the same process.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from chaos.config import ChaosConfig
from schedlock.core.identities import Scheduler

KILL = "kill_leader"
STOP = "sigstop_leader"
PARTITION = "partition"
PG_RESTART = "pg_restart"
TERMINATE = "pg_terminate"
SIGTERM = "sigterm_leader"
OPERATOR_KILL = "operator_kill"
FAILOVER_SYNC = "failover_sync"
FAILOVER_ASYNC = "failover_async"
APP_5XX = "app_5xx"
APP_HANG = "app_hang"
APP_SLOW = "app_slow"

INFRA_KINDS = (
    KILL,
    STOP,
    PARTITION,
    PG_RESTART,
    TERMINATE,
    SIGTERM,
    OPERATOR_KILL,
    FAILOVER_SYNC,
    FAILOVER_ASYNC,
)
APP_KINDS = (APP_5XX, APP_HANG, APP_SLOW)
ALL_KINDS = INFRA_KINDS + APP_KINDS

# Faults that end a leader's term without a graceful release: a delivery in flight across one
# may be delivered again (same key).  SIGTERM is deliberately absent: a graceful stop must not
# duplicate anything.  A fail-over kills the primary: every term ends like in a crash.
CRASH_KINDS = frozenset(
    {KILL, STOP, PARTITION, PG_RESTART, TERMINATE, FAILOVER_SYNC, FAILOVER_ASYNC}
)
# The settle time of a fail-over covers the promotion, the old primary's read-only spell and
# its rebuild as the new standby (pg_basebackup), so the next fail-over finds a standby again.
FAILOVER_SETTLE_SECONDS = 9.0


@dataclass(frozen=True)
class PlannedFault:
    kind: str
    at: float  # seconds after the load started
    hold: float  # seconds the fault lasts / the victim stays down
    target: str
    scheduler: str  # which lock key's leader is the victim ("publish" or "recurring")
    variant: str  # kind-specific: pg stop mode, terminate scope, partition victim
    pick: float  # in [0, 1): picks among candidates when the victim is not a leader

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _infra(kind: str, rng: random.Random, config: ChaosConfig) -> tuple[float, str, float]:
    """(hold, variant, expected seconds until the system is steady again)."""
    lease = config.timings.lease_seconds
    if kind == KILL:
        hold = rng.uniform(0.5, 2.5)  # until the killed replica is restarted
        return hold, "", hold + 2.0
    if kind == STOP:
        if rng.random() < 0.25:  # a pause under the lease: may or may not cost the lead
            hold = rng.uniform(0.5, lease - 0.2)
            return hold, "short", hold + 2.0
        hold = lease + rng.uniform(1.0, 3.0)  # past the lease
        return hold, "", hold + 1.5
    if kind == PARTITION:
        draw = rng.random()
        if draw < 0.25:  # a hiccup under the lease, on the leader
            hold = rng.uniform(0.5, lease - 0.2)
            return hold, "short", hold + 2.0
        hold = lease + rng.uniform(1.0, 4.0)
        if draw < 0.65:
            return hold, "leader", hold + 2.0
        if draw < 0.85:  # one-way: only what the leader sends, or only what it receives, is held
            return hold, "to_server" if rng.random() < 0.5 else "to_client", hold + 2.0
        return hold, "any", hold + 2.0
    if kind == PG_RESTART:
        hold = rng.uniform(0.0, 2.5)  # extra downtime between stop and start
        variant = "fast" if rng.random() < 0.7 else "immediate"
        return hold, variant, hold + 4.0
    if kind == TERMINATE:
        draw = rng.random()
        variant = "lock" if draw < 0.4 else "holder" if draw < 0.8 else "all"
        return 0.0, variant, 1.5
    if kind == SIGTERM:
        hold = rng.uniform(0.5, 2.0)
        return hold, "", hold + config.shutdown_grace_seconds + 2.0
    if kind == OPERATOR_KILL:
        hold = rng.uniform(1.0, 4.0)
        return hold, "", hold + 5.0
    if kind == FAILOVER_SYNC:
        hold = rng.uniform(0.0, 1.0)  # from the kill of the primary to the promotion
        return hold, "", hold + FAILOVER_SETTLE_SECONDS
    if kind == FAILOVER_ASYNC:
        hold = rng.uniform(1.0, 3.0)  # replication cut: what the primary commits meanwhile is lost
        return hold, "", hold + FAILOVER_SETTLE_SECONDS
    raise ValueError(kind)


def _placed(
    rng: random.Random,
    config: ChaosConfig,
    kind: str,
    t: float,
    hold: float,
    variant: str,
    scheduler_and_pick: Callable[[], tuple[str, float]] | tuple[str, float],
) -> PlannedFault:
    """A fault at ``t`` against a random target; the draws stay in the order seeds rely on
    (target first, then the scheduler and the pick)."""
    target = rng.choice(config.targets)
    drawn = scheduler_and_pick
    scheduler, pick = drawn if isinstance(drawn, tuple) else drawn()
    return PlannedFault(
        kind=kind,
        at=round(t, 3),
        hold=round(hold, 3),
        target=target,
        scheduler=scheduler,
        variant=variant,
        pick=pick,
    )


def plan_faults(config: ChaosConfig) -> list[PlannedFault]:
    rng = random.Random(config.seed)
    end = config.duration - config.quiet_tail_seconds
    kinds = [k for k in INFRA_KINDS if config.with_operator or k != OPERATOR_KILL]
    faults: list[PlannedFault] = []

    def scheduler_and_pick() -> tuple[str, float]:
        return Scheduler.PUBLISH if rng.random() < 0.6 else Scheduler.RECURRING, rng.random()

    t = config.first_fault_seconds
    bag: list[str] = []
    while True:
        if not bag:
            bag = list(kinds)
            rng.shuffle(bag)
        kind = bag.pop()
        hold, variant, settle = _infra(kind, rng, config)
        if t + settle > end:
            break
        faults.append(_placed(rng, config, kind, t, hold, variant, scheduler_and_pick))
        t += settle + rng.uniform(2.0, 6.0)

    t = config.first_fault_seconds + rng.uniform(0.0, 8.0)
    while True:
        kind = rng.choice(APP_KINDS)
        hold = {APP_5XX: rng.uniform(2.0, 8.0), APP_HANG: rng.uniform(2.0, 6.0)}.get(
            kind, rng.uniform(6.0, 15.0)
        )
        # A slow app (answers after 0.1-0.4 s, well inside the request timeout) keeps several
        # deliveries in flight, so a crash meanwhile re-fires some of them.
        delay = round(rng.uniform(0.1, 0.4), 3) if kind == APP_SLOW else 0.0
        if t + hold > end:
            break
        variant = f"{delay:g}s" if delay else ""
        faults.append(_placed(rng, config, kind, t, hold, variant, ("", delay)))
        t += hold + rng.uniform(6.0, 18.0)
    return sorted(faults, key=lambda f: f.at)
