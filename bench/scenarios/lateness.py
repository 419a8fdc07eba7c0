"""Lateness: rows spread evenly over a window; arrival at the receiver minus due time.

Each system runs on its own instance (3 replicas).  schedlock runs alone; the two baselines
and the two peers, whose lateness is seconds (the seed's tick, the Lease leader's poll,
River's scheduler and fetch poll, procrastinate's fetch poll), run side by side.  A row
that has not arrived ``lateness_drain_s`` after the last due time counts as censored with its
lateness so far (a lower bound) — the seed cannot keep up with 83 rows/s.
"""

from __future__ import annotations

import asyncio
import time

from bench.context import Context
from bench.profiles import PEERS
from bench.rows import due_times, insert_due
from bench.stats import summarize
from bench.systems import INSTANCES, together, until

LEAD_IN_S = 2.0  # the first row is due this long after the rows are written


async def _measure(ctx: Context, system: str) -> None:
    p = ctx.profile
    inst = INSTANCES[system](ctx.env, p, "late", p.replicas)
    try:
        inst.start()
        await inst.wait_ready()
        if inst.standing_leader:  # the seed and procrastinate have none
            await until(inst.leader_name, 60, 0.05, f"a {system} leader")
        spacing = p.lateness_span_s / p.lateness_rows
        start = time.time() + LEAD_IN_S
        insert_due(
            inst.db_url,
            prefix="late",
            count=p.lateness_rows,
            start_at=start,
            spacing=spacing,
            namespace=inst.namespace,
            target=inst.target,
        )
        due = due_times(inst.db_url, "late")
        end = start + p.lateness_span_s + p.lateness_drain_s
        while time.time() < end and len(inst.log.first_arrivals()) < len(due):
            await asyncio.sleep(0.25)
        cutoff = time.time()
        first = inst.log.first_arrivals()
        values = [(first[uid].arrival - at) * 1000 for uid, at in due.items() if uid in first]
        missing = [(cutoff - at) * 1000 for uid, at in due.items() if uid not in first]
        entry = summarize(values + missing, censored=len(missing))
        entry["rows"] = len(due)
        entry["span_s"] = p.lateness_span_s
        ctx.results.setdefault("lateness_ms", {})[system] = entry
        ctx.series.setdefault("lateness_ms", {})[system] = values + missing
        ctx.censored.setdefault("lateness_ms", {})[system] = [False] * len(values) + [True] * len(
            missing
        )
        ctx.say(
            f"lateness {system}: p50 {entry['p50']} ms, p99 {entry['p99']} ms, "
            f"{len(missing)} of {len(due)} not delivered in time"
        )
    finally:
        inst.stop()


async def run(ctx: Context) -> None:
    await _measure(ctx, "schedlock")
    await together(*(_measure(ctx, system) for system in ("seed_tick", "k8s_lease", *PEERS)))
