"""Tenancy: what row-level security costs the sidecar's hot path (migrations 0008, 0011; issue 20).

The same key, led by a real sidecar group of ``replicas``, measured three ways side by side,
each on a fresh database of the benchmark's one PostgreSQL:

* ``owner`` — the sidecars connect as the schema's owner, whom row-level security does not
  apply to (ENABLE, not FORCE): what every release before 0008 ran, the reference;
* ``every_namespace`` — a login role granted the plain way (``migrate --grant-sidecar ROLE``:
  ``*``, single-tenant): the policies run and let every row through;
* ``namespace`` — a login role granted for the key's namespace only
  (``migrate --grant-sidecar ROLE --namespace NS``): the policies run and filter.

Neither role is a superuser: both are subject to the policies, as a real install's are.  Per
mode and each of ``tenancy_trials`` trials: lateness (``tenancy_lateness_rows`` due evenly) and
throughput (``tenancy_throughput_rows`` in ``TENANCY_BURSTS`` bursts due at once; the figure is
the median burst of all trials, the ratio the median of each burst's over the owner's burst of
the same round), :mod:`bench.trials`.  The three groups run at once and take
turns at a fine grain: their lateness rows interleaved (one row due every
``tenancy_lateness_span_s / rows`` seconds in all, the modes in turn: one mode's rate, each
mode's rows spanning three times as long), their bursts one after another with the order
rotating.  Only one mode is busy at any moment, and the machine's load, on whatever timescale,
falls on all three alike: on a shared two-core machine, whole modes taken in turns (the design
before) varied 3× between trials of one mode, more than the cost measured.  The ratios are each
mode's figure over the owner's.  Target (the issue's): a role under row-level security, either
one, costs at most 10 % — lateness p50 and p99 ≤ 1.1×, throughput ≥ 0.9× the owner's.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

from bench import trials
from bench.context import Context
from bench.stats import summarize
from bench.systems import SchedlockInstance, until
from schedlock.store import GrantRequest, open_store

MODES = ("owner", "every_namespace", "namespace")
ROLES = {"every_namespace": "bench_every_namespace", "namespace": "bench_one_namespace"}
MAX_COST = 0.10
TENANCY_BURSTS = 5  # throughput bursts per mode and trial, taken in turns
# A burst's rows are due this long after they are written: the modes' bursts of one round come
# a second or two apart, so the load on the machine is much the same for the three.
BURST_LEAD_S = 0.5
RETENTION_OFF = {"SCHEDLOCK_RETENTION_SECONDS": "0", "SCHEDLOCK_FAILED_RETENTION_SECONDS": "0"}


class TenancyInstance(SchedlockInstance):
    """schedlock on the bench's key, its sidecars connected as the mode's role."""

    short = "ten"

    def __init__(self, ctx: Context, mode: str, trial: int) -> None:
        super().__init__(ctx.env, ctx.profile, f"{mode}{trial}", ctx.profile.replicas)
        self.role = ROLES.get(mode)

    async def grant(self, mode: str) -> None:
        """Create the mode's login role (once; no superuser) and grant it on this database as
        the owner, through the store's own grant (what `schedlock migrate --grant-…` runs)."""
        if self.role is None:
            return
        self.env.sql(
            f'DO $$ BEGIN CREATE ROLE "{self.role}" LOGIN; '
            "EXCEPTION WHEN duplicate_object THEN NULL; END $$"
        )
        store = open_store(self.db_url, application_name="bench-tenancy-grant")
        try:
            scope = (self.namespace,) if mode == "namespace" else ()
            await store.grant(
                GrantRequest(sidecar_role=self.role, operator_role=None, namespaces=scope)
            )
        finally:
            await store.close()

    def replica_url(self, name: str) -> str:
        if self.role is None:
            return super().replica_url(name)
        return self.env.pg.url(self.dbname, user=self.role)

    def settings(self) -> dict[str, str]:
        # a runtime role has no DDL (the database comes migrated); the rows stay for the count
        return {**super().settings(), **RETENTION_OFF, "SCHEDLOCK_MIGRATE": "off"}


def _turn(trial: int) -> tuple[str, ...]:
    """The modes in turn, starting with the next mode each time."""
    first = trial % len(MODES)
    return MODES[first:] + MODES[:first]


async def _trial(ctx: Context, trial: int) -> dict[str, tuple[list[float], dict[str, Any]]]:
    """The three modes side by side, each a sidecar group on a fresh database of its own:
    lateness rows interleaved (a row every ``span / rows`` seconds, the modes in turn), then
    throughput in bursts taken in turns (``TENANCY_BURSTS`` per mode, the order rotating), so
    that the machine's load, on whatever timescale, falls on all three alike.  Only one mode is
    busy at any moment: an idle group costs nothing."""
    p = ctx.profile
    insts = {mode: TenancyInstance(ctx, mode, trial) for mode in MODES}
    try:
        for mode, inst in insts.items():
            await inst.grant(mode)
            inst.start()
        for mode, inst in insts.items():
            await inst.wait_ready()
            await until(inst.leader_name, 60, 0.05, f"a leader ({mode})")
        # One row due every span / rows seconds overall, the rate one mode had alone: each
        # mode's rows span len(MODES) times as long, the modes one row's spacing apart.
        spacing = p.tenancy_lateness_span_s / p.tenancy_lateness_rows
        start = time.time() + trials.LEAD_IN_S
        late = dict(
            zip(
                _turn(trial),
                await asyncio.gather(
                    *(
                        trials.lateness(
                            insts[mode],
                            "late",
                            count=p.tenancy_lateness_rows,
                            span_s=p.tenancy_lateness_span_s * len(MODES),
                            drain_s=p.lateness_drain_s,
                            start_at=start + place * spacing,
                        )
                        for place, mode in enumerate(_turn(trial))
                    )
                ),
                strict=True,
            )
        )
        bursts: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
        rows = max(1, p.tenancy_throughput_rows // TENANCY_BURSTS)
        for burst in range(TENANCY_BURSTS):
            for mode in _turn(trial + burst):
                bursts[mode].append(
                    await trials.throughput(
                        insts[mode],
                        f"tput{burst}",
                        rows=rows,
                        cap_s=p.throughput_cap_s,
                        lead_s=BURST_LEAD_S,
                    )
                )
    finally:
        for inst in insts.values():
            inst.stop()
    return {mode: (late[mode], _together(bursts[mode])) for mode in MODES}


def _together(bursts: list[dict[str, Any]]) -> dict[str, Any]:
    """A mode's bursts of one trial: every fire over every burst's seconds, and each burst's
    rate (the scenario's figure is the median burst of all trials)."""
    fires = sum(int(b["fires"]) for b in bursts)
    seconds = sum(float(b["seconds"]) for b in bursts)
    return {
        "fires_per_s": round(fires / seconds, 1) if seconds > 0 else None,
        "fires": fires,
        "seconds": round(seconds, 2),
        "capped": any(b["capped"] for b in bursts),
        "bursts_fires_per_s": [b["fires_per_s"] for b in bursts],
    }


def _within(ratio: dict[str, float | None]) -> bool:
    """The issue's target: lateness p50 and p99 at most 1.1×, throughput at least 0.9×."""
    p50, p99, rate = ratio["lateness_p50"], ratio["lateness_p99"], ratio["throughput"]
    if p50 is None or p99 is None or rate is None:
        return False
    return max(p50, p99) <= 1 + MAX_COST and rate >= 1 - MAX_COST


def _paired(mode: list[dict[str, Any]], owner: list[dict[str, Any]]) -> float | None:
    """Throughput over the owner's: the median, over every round of every trial, of the mode's
    burst rate over the owner's burst of the same round (a second or two apart), so that what
    loads the machine for longer than a round cancels out."""
    ratios = [
        r
        for m, o in zip(mode, owner, strict=True)
        for a, b in zip(m["bursts_fires_per_s"], o["bursts_fires_per_s"], strict=True)
        if (r := _ratio(a, b)) is not None
    ]
    return round(statistics.median(ratios), 3) if ratios else None


def _ratio(value: float | None, reference: float | None) -> float | None:
    if value is None or reference is None or reference <= 0:
        return None
    return round(value / reference, 3)


async def run(ctx: Context) -> None:
    p = ctx.profile
    late: dict[str, list[float]] = {mode: [] for mode in MODES}
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    for trial in range(p.tenancy_trials):
        measured = await _trial(ctx, trial)
        for mode in MODES:
            values, tput = measured[mode]
            late[mode] += values
            runs[mode].append(tput)
            ctx.say(
                f"tenancy {mode} #{trial + 1}: lateness p99 {summarize(values)['p99']} ms, "
                f"{tput['fires_per_s']} fires/s (bursts: {tput['bursts_fires_per_s']})"
            )
    modes: dict[str, Any] = {}
    for mode in MODES:
        # The median burst: a load spike that slows one burst (a second or so) moves it little.
        rates = [rate for r in runs[mode] for rate in r["bursts_fires_per_s"] if rate is not None]
        modes[mode] = {
            "lateness_ms": summarize(late[mode]),
            "throughput": {
                "fires_per_s": round(statistics.median(rates), 1) if rates else None,
                "runs": runs[mode],
            },
        }
        ctx.series.setdefault("tenancy_lateness_ms", {})[mode] = late[mode]
    owner = modes["owner"]
    ratio = {
        mode: {
            "lateness_p50": _ratio(modes[mode]["lateness_ms"]["p50"], owner["lateness_ms"]["p50"]),
            "lateness_p99": _ratio(modes[mode]["lateness_ms"]["p99"], owner["lateness_ms"]["p99"]),
            "throughput": _paired(runs[mode], runs["owner"]),
        }
        for mode in MODES[1:]
    }
    met = all(_within(ratio[mode]) for mode in MODES[1:])
    ctx.results["tenancy"] = {
        "modes": modes,
        "ratio": ratio,
        "trials": p.tenancy_trials,
        "rows": {
            "lateness": p.tenancy_lateness_rows,
            "throughput": p.tenancy_throughput_rows,
            "bursts": TENANCY_BURSTS,
        },
        "targets": {"max_cost": MAX_COST, "met": met},
    }
    for mode in MODES[1:]:
        r = ratio[mode]
        ctx.say(
            f"tenancy: {mode} role over owner — lateness p50 {r['lateness_p50']}×, "
            f"p99 {r['lateness_p99']}×, throughput {r['throughput']}×"
        )
    ctx.say(f"tenancy: target within {MAX_COST:.0%} for both roles: {'met' if met else 'NOT met'}")
