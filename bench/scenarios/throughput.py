"""Throughput: many rows due at the same instant, one leader, a local no-op receiver.

fires/s = rows delivered / (last arrival − due time), or rows delivered by the cap / the cap
when the run hits it (``capped``).  Every run starts on a fresh instance (an empty table: the
claim's cost grows with the rows already in it).  schedlock runs alone, its runs one after
another; the baselines run once, side by side (the seed is bounded by its tick, not by the
CPU), then each peer once, one after the other.  The schedlock leader's peak RSS
(``VmHWM``) after the run goes into ``footprint``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bench.context import Context
from bench.profiles import PEERS
from bench.rows import insert_due
from bench.stats import summarize
from bench.systems import (
    INSTANCES,
    Instance,
    cpu_seconds,
    postgres_cpu_seconds,
    rss_mb,
    together,
    until,
)

LEAD_IN_S = 1.5


def _cpu(ctx: Context, inst: Instance) -> dict[str, float]:
    assert ctx.env.pg.process is not None
    assert inst.receiver.process is not None
    return {
        "replicas": sum(cpu_seconds(r.pid) or 0.0 for r in inst.replicas),
        "receiver": cpu_seconds(inst.receiver.process.pid) or 0.0,
        "postgres": postgres_cpu_seconds(ctx.env.pg.process.pid),
    }


def _arrivals(inst: Instance, prefix: str) -> list[float]:
    return [
        e.arrival for uid, e in inst.log.first_arrivals().items() if uid.startswith(prefix + "-")
    ]


async def _trial(ctx: Context, system: str, trial: int) -> tuple[float, dict[str, Any]]:
    """One run on a fresh instance: every trial starts from an empty table."""
    p = ctx.profile
    inst = INSTANCES[system](ctx.env, p, f"tput{trial}", p.replicas)
    try:
        inst.start()
        await inst.wait_ready()
        if inst.standing_leader:
            await until(inst.leader_name, 60, 0.05, f"a {system} leader")
        prefix = "tput"
        due = time.time() + LEAD_IN_S
        insert_due(
            inst.db_url,
            prefix=prefix,
            count=p.throughput_rows,
            start_at=due,
            spacing=0.0,
            namespace=inst.namespace,
            target=inst.target,
        )
        await asyncio.sleep(max(0.0, due - time.time()))
        cpu0 = _cpu(ctx, inst)
        end = due + p.throughput_cap_s
        arrivals = _arrivals(inst, prefix)
        while time.time() < end and len(arrivals) < p.throughput_rows:
            await asyncio.sleep(0.2)
            arrivals = _arrivals(inst, prefix)
        cpu1 = _cpu(ctx, inst)
        wall = time.time() - due
        capped = len(arrivals) < p.throughput_rows
        in_cap = [a for a in arrivals if a <= end]
        seconds = p.throughput_cap_s if capped else max(arrivals) - due
        rate = len(in_cap) / seconds if seconds > 0 else 0.0
        ctx.say(
            f"throughput {system} #{trial + 1}: {rate:.0f} fires/s "
            f"({len(in_cap)} in {seconds:.1f} s{', capped' if capped else ''})"
        )
        if system == "schedlock":
            leader = inst.by_name(inst.leader_name())
            peak = rss_mb(leader.pid, "VmHWM") if leader is not None else None
            if peak is not None:
                ctx.extras.setdefault("peak_rss_mb", []).append(peak)
        return rate, {
            "fires": len(in_cap),
            "seconds": round(seconds, 3),
            "capped": capped,
            # % of one core from the due time to the end of the run: what bounds it
            "cpu_percent": {k: round((cpu1[k] - cpu0[k]) / wall * 100, 1) for k in cpu0},
        }
    finally:
        inst.stop()


async def _measure(ctx: Context, system: str, trials: int) -> None:
    p = ctx.profile
    rates: list[float] = []
    runs: list[dict[str, Any]] = []
    for trial in range(trials):
        rate, run = await _trial(ctx, system, trial)
        rates.append(rate)
        runs.append(run)
    entry = summarize(rates)
    entry["rows"] = p.throughput_rows
    entry["cap_s"] = p.throughput_cap_s
    entry["runs"] = runs
    ctx.results.setdefault("throughput_fires_per_s", {})[system] = entry


async def run(ctx: Context) -> None:
    await _measure(ctx, "schedlock", ctx.profile.throughput_trials)
    await together(_measure(ctx, "seed_tick", 1), _measure(ctx, "k8s_lease", 1))
    for peer in PEERS:  # CPU-bound like schedlock: one after another, once each
        await _measure(ctx, peer, 1)
