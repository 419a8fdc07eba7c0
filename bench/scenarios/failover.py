"""Failover: SIGKILL, SIGSTOP and SIGTERM of the leader while rows are due every 10 ms.

A trial: wait for the leader to be firing, signal it, and look at the receiver's log — the gap
between the last delivery before the signal (or any delivery of the victim) and the first
delivery by another replica after it, minus the normal 10 ms spacing of the rows.  The victim
is then replaced by a fresh replica (as a Deployment would) before the next trial.  A trial
that reaches its cap counts as the cap (a lower bound) and is marked censored.

The peers (bench/peers/) fire from every replica the jobs already made available, so their
trial waits for a row due after the signal (River: after its scheduler's 5 s look-ahead) and
takes the longest pause in deliveries before it; River's victim is its elected leader,
procrastinate's (no leader) a worker with a job in ``doing``.  ``stuck_rows`` counts the jobs
the victim was working that are still unfinished at the end of the trial.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import signal
import time
from dataclasses import dataclass
from typing import Any

from bench.context import Context
from bench.profiles import PEERS
from bench.rows import RowStream
from bench.stats import summarize
from bench.systems import INSTANCES, Instance, Replica, acquired_at, hard_kill, until
from testbed.deliveries import DeliveryLog
from testbed.sidecars import SidecarProcess

SIGNALS = {
    "failover_sigkill_ms": signal.SIGKILL,
    "failover_sigstop_ms": signal.SIGSTOP,
    "handover_sigterm_ms": signal.SIGTERM,
}


@dataclass
class Trial:
    gap_ms: float
    censored: bool
    victim: str
    successor: str | None
    exit_code: int | None = None
    # schedlock only, from the successor's log: signal -> leadership_acquired of the key,
    # and acquired -> its first delivery at the receiver
    acquired_ms: float | None = None
    first_fire_ms: float | None = None
    # peers (bench/peers/): jobs the victim was working that are still unfinished at the end
    stuck: int | None = None


@dataclass
class Plan:
    scenario: str
    trials: int
    cap_s: float


def _first_after(
    log: DeliveryLog, mark: int, t_signal: float, victim: str, due_after: float | None = None
) -> float | None:
    """The first delivery by another replica after the signal (for a peer: of a row due after
    ``due_after`` — the others go on firing the jobs already made available)."""
    entries = log.refresh()
    found = [
        e.arrival
        for e in entries[max(0, mark - 200) :]
        if e.arrival > t_signal
        and e.holder != victim
        and (due_after is None or (e.scheduled or 0.0) > due_after)
    ]
    return min(found) if found else None


def _longest_hole(log: DeliveryLog, mark: int, t_signal: float, end: float) -> float:
    """A peer's longest pause in deliveries (any replica) from the last one before the signal
    until ``end`` (its recovery, or the cap), in seconds."""
    times = sorted(e.arrival for e in log.refresh()[max(0, mark - 2000) :] if e.arrival < end)
    before = [t for t in times if t <= t_signal]
    points = [before[-1] if before else t_signal, *(t for t in times if t > t_signal), end]
    return max(b - a for a, b in itertools.pairwise(points))


def _last_before(log: DeliveryLog, mark: int, t_signal: float, victim: str) -> float | None:
    entries = log.refresh()
    found = [
        e.arrival
        for e in entries[max(0, mark - 2000) :]
        if e.arrival <= t_signal or e.holder == victim
    ]
    return max(found) if found else None


def _successor(log: DeliveryLog, first: float) -> str | None:
    return next((e.holder for e in log.entries if e.arrival == first), None)


async def _signal_leader(
    ctx: Context, inst: Instance, sig: signal.Signals
) -> tuple[Replica, int, float]:
    """Signal the leader while it fires; returns (victim, log mark, signal time)."""
    spacing = ctx.profile.row_spacing_s
    leader_wait = max(60.0, 3 * ctx.profile.timings.seed_tick_s)
    # Steady state first: a delivery after the previous trial's recovery, so that one trial's
    # gap never includes the previous one's (the seed's lock holder may not have fired yet).
    since = time.time()
    await until(
        lambda: any(e.arrival > since for e in inst.log.refresh()[-50:]),
        leader_wait,
        0.02,
        f"a {inst.system} delivery before the trial",
    )
    for _ in range(20):
        victim: Replica = await inst.active_leader(leader_wait)
        if inst.standing_leader:  # the seed and procrastinate are caught mid-fire: at once
            await asyncio.sleep(random.uniform(0, 2 * spacing))  # no phase lock with the rows
        inst.log.refresh()
        mark = len(inst.log.entries)
        t_signal = time.time()
        victim.signal(sig)
        if sig is not signal.SIGSTOP or inst.system != "seed_tick":
            return victim, mark, t_signal
        # A seed replica holds the lock only while it fires: a freeze that came just after its
        # tick ended froze a bystander. Resume it and try again.
        if inst.leader_name() == victim.name:
            return victim, mark, t_signal
        victim.signal(signal.SIGCONT)
    raise TimeoutError(f"could not freeze a {inst.system} replica while it held the lock")


async def _trial(ctx: Context, inst: Instance, sig: signal.Signals, cap_s: float) -> Trial:
    spacing = ctx.profile.row_spacing_s
    victim, mark, t_signal = await _signal_leader(ctx, inst, sig)
    held = inst.running_jobs(victim)
    horizon = inst.recovery_horizon_s
    due_after = None if horizon is None else t_signal + horizon
    first: float | None = None
    with contextlib.suppress(TimeoutError):
        first = await until(
            lambda: _first_after(inst.log, mark, t_signal, victim.name, due_after), cap_s, 0.005
        )
    await asyncio.sleep(0.2)  # let late log lines of the victim's last requests land
    # A capped trial: the gap is at least as long as the wait (a lower bound).
    end = t_signal + cap_s if first is None else first
    if horizon is None:
        last = _last_before(inst.log, mark, t_signal, victim.name) or t_signal
        gap = (end - last - spacing) * 1000
    else:
        gap = (_longest_hole(inst.log, mark, t_signal, end) - spacing) * 1000
    exit_code: int | None = None
    process = victim.process
    if sig is signal.SIGTERM and process is not None:
        with contextlib.suppress(TimeoutError):
            await until(lambda: process.poll() is not None, 15, 0.01, "the victim to exit")
        exit_code = process.poll()
    trial = Trial(
        gap_ms=gap,
        censored=first is None,
        victim=victim.name,
        successor=None if first is None else _successor(inst.log, first),
        exit_code=exit_code,
        stuck=None if held is None else len(inst.still_running(held)),
    )
    elected = inst.elected_at(victim.name, t_signal)
    if elected is not None and first is not None:  # River: its election, then the scheduler
        trial.acquired_ms = (elected - t_signal) * 1000
        trial.first_fire_ms = (first - elected) * 1000
    successor = inst.by_name(trial.successor)
    if isinstance(successor, SidecarProcess) and first is not None:
        key = f"publish/{inst.namespace}/{inst.target}"
        acquired = acquired_at(successor.log_path, key, t_signal - 0.002)
        if acquired is not None:
            trial.acquired_ms = (acquired - t_signal) * 1000
            trial.first_fire_ms = (first - acquired) * 1000
    hard_kill(victim)
    fresh = inst.replace(victim)
    await until(fresh.ready, 90, 0.05, f"{fresh.name} to be ready")
    return trial


async def _feed(stream: RowStream) -> None:
    while True:
        stream.top_up()
        await asyncio.sleep(0.5)


async def run_block(
    ctx: Context, system: str, label: str, plans: list[Plan]
) -> dict[str, list[Trial]]:
    """Start one instance of ``system`` and run ``plans`` on it in order."""
    inst = INSTANCES[system](ctx.env, ctx.profile, label, ctx.profile.replicas)
    stream = RowStream(
        inst.db_url,
        prefix=label,
        spacing=ctx.profile.row_spacing_s,
        namespace=inst.namespace,
        target=inst.target,
    )
    feeder: asyncio.Task[None] | None = None
    out: dict[str, list[Trial]] = {}
    try:
        inst.start()
        await inst.wait_ready()
        feeder = asyncio.create_task(_feed(stream))
        for plan in plans:
            sig = SIGNALS[plan.scenario]
            trials = out.setdefault(plan.scenario, [])
            for number in range(plan.trials):
                trial = await _trial(ctx, inst, sig, plan.cap_s)
                trials.append(trial)
                ctx.say(
                    f"{plan.scenario} {system} #{number + 1}/{plan.trials}: "
                    f"{trial.gap_ms:.1f} ms{' (cap)' if trial.censored else ''} "
                    f"{trial.victim} -> {trial.successor}"
                )
    finally:
        if feeder is not None:
            feeder.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await feeder
        stream.close()
        inst.stop()
    return out


def record(ctx: Context, scenario: str, system: str, trials: list[Trial], cap_s: float) -> None:
    gaps = [t.gap_ms for t in trials]
    entry: dict[str, Any] = summarize(gaps, censored=sum(t.censored for t in trials))
    entry["cap_ms"] = round(cap_s * 1000)
    entry["trials_ms"] = [round(g, 1) for g in gaps]
    if scenario == "handover_sigterm_ms":
        entry["clean_exits"] = sum(t.exit_code == 0 for t in trials)
    stuck = [t.stuck for t in trials if t.stuck is not None]
    if stuck:  # peers: the victim's jobs left unfinished at the end of each trial
        entry["stuck_rows"] = stuck
        entry["stuck_rows_total"] = sum(stuck)
    acquired = [t.acquired_ms for t in trials if t.acquired_ms is not None]
    if acquired:  # where the time goes (schedlock): the lock hand-over, then the first fire
        entry["signal_to_acquired_ms"] = summarize(acquired)
        entry["acquired_to_first_delivery_ms"] = summarize(
            [t.first_fire_ms for t in trials if t.first_fire_ms is not None]
        )
    ctx.results.setdefault(scenario, {})[system] = entry
    ctx.series.setdefault(scenario, {})[system] = gaps
    ctx.censored.setdefault(scenario, {})[system] = [t.censored for t in trials]


def caps(ctx: Context) -> dict[tuple[str, str], float]:
    """How long a trial may wait for the first delivery after the signal."""
    p, t = ctx.profile, ctx.profile.timings
    return {
        ("failover_sigkill_ms", "schedlock"): 10.0,
        ("handover_sigterm_ms", "schedlock"): 10.0,
        ("failover_sigstop_ms", "schedlock"): t.schedlock_lease_s + 15.0,
        ("failover_sigkill_ms", "seed_tick"): p.baseline_gap_cap_s,
        ("failover_sigstop_ms", "seed_tick"): p.seed_sigstop_cap_s,
        ("failover_sigkill_ms", "k8s_lease"): p.baseline_gap_cap_s,
        ("failover_sigstop_ms", "k8s_lease"): p.baseline_gap_cap_s,
        ("failover_sigkill_ms", "river"): p.baseline_gap_cap_s,
        ("handover_sigterm_ms", "river"): p.baseline_gap_cap_s,
        ("failover_sigstop_ms", "river"): p.baseline_gap_cap_s,
        ("failover_sigkill_ms", "procrastinate"): p.peer_no_leader_cap_s,
        ("failover_sigstop_ms", "procrastinate"): p.peer_no_leader_cap_s,
    }


def _plan(ctx: Context, scenario: str, system: str) -> Plan:
    p = ctx.profile
    if scenario == "handover_sigterm_ms" and system == "schedlock":
        trials = p.sigterm_trials
    elif scenario in ("failover_sigkill_ms", "handover_sigterm_ms"):  # a peer: as many as kills
        trials = p.sigkill_trials[system]
    else:
        trials = p.sigstop_trials[system]
    return Plan(scenario, trials, caps(ctx)[(scenario, system)])


async def run(ctx: Context, scenarios: list[str]) -> None:
    """Quiet phase: schedlock's millisecond trials alone.  Then every seconds-long trial
    (schedlock's SIGSTOP, both baselines) concurrently, each on its own instance."""
    quiet = [
        _plan(ctx, scenario, "schedlock")
        for scenario in ("failover_sigkill_ms", "handover_sigterm_ms")
        if scenario in scenarios
    ]
    if quiet:
        ctx.say("failover: schedlock SIGKILL / SIGTERM trials (quiet phase)")
        done = await run_block(ctx, "schedlock", "fo", quiet)
        for plan in quiet:
            record(ctx, plan.scenario, "schedlock", done[plan.scenario], plan.cap_s)
    blocks: list[tuple[str, str, Plan]] = []
    if "failover_sigstop_ms" in scenarios:
        blocks.append(("schedlock", "stop", _plan(ctx, "failover_sigstop_ms", "schedlock")))
    for system in ("seed_tick", "k8s_lease", *PEERS):
        for scenario, label in (("failover_sigkill_ms", "kill"), ("failover_sigstop_ms", "stop")):
            if scenario in scenarios:
                blocks.append((system, label, _plan(ctx, scenario, system)))
    if "handover_sigterm_ms" in scenarios:  # River resigns on SIGTERM: a hand-over to measure
        blocks.append(("river", "term", _plan(ctx, "handover_sigterm_ms", "river")))
    if not blocks:
        return
    ctx.say("failover: SIGSTOP trials and the baselines' trials (concurrent phase)")
    # Every block runs to its end even if another fails: no instance outlives this phase.
    outcomes = await asyncio.gather(
        *(run_block(ctx, system, label, [plan]) for system, label, plan in blocks),
        return_exceptions=True,
    )
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    for (system, _, plan), outcome in zip(blocks, outcomes, strict=True):
        if not isinstance(outcome, BaseException):
            record(ctx, plan.scenario, system, outcome[plan.scenario], plan.cap_s)
    if errors:
        raise errors[0]
