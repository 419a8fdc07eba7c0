"""Scale: 50 sidecar processes over 10 targets on one PostgreSQL.

Every sidecar runs both schedulers, so 10 targets are 20 lock keys with 5 candidates each.
Sampled from ``pg_locks`` several times: exactly one granted holder per key, the others
waiting.  Connections come from ``pg_stat_activity``.  One row per target then checks that
each target's leader fires its own row, once.
"""

from __future__ import annotations

import asyncio
import collections
import signal
import time
from typing import Any

from schedlock.store.keys import SCHEDLOCK_CLASS_ID

from bench.context import Context
from bench.deliveries import DeliveryLog
from bench.rows import insert_due
from bench.stats import summarize
from bench.systems import rss_mb, until
from tests.support.sidecars import ReceiverProcess, SidecarProcess

SAMPLES = 10


def _locks(ctx: Context, oid: int) -> dict[int, list[bool]]:
    rows = ctx.env.sql(
        "SELECT objid::int, granted FROM pg_locks WHERE locktype = 'advisory' AND database = %s "
        "AND classid = %s::int::oid AND objsubid = 2",
        (oid, SCHEDLOCK_CLASS_ID),
    )
    keys: dict[int, list[bool]] = collections.defaultdict(list)
    for objid, granted in rows:
        keys[int(objid)].append(bool(granted))
    return keys


async def run(ctx: Context) -> None:
    p = ctx.profile
    dbname = ctx.env.new_database("scale")
    url = ctx.env.url(dbname)
    oid = ctx.env.database_oid(dbname)
    workdir = ctx.env.workdir / dbname
    receiver = ReceiverProcess(workdir / "receiver").start()
    targets = [f"app{i}" for i in range(p.scale_targets)]
    keys = 2 * len(targets)
    sidecars: list[SidecarProcess] = []
    try:
        t0 = time.monotonic()
        for number in range(p.scale_sidecars):
            target = targets[number % len(targets)]
            env = {
                "SCHEDLOCK_DATABASE_URL": url,
                "SCHEDLOCK_TARGET": target,
                "SCHEDLOCK_TARGET_URL": receiver.url,
                "SCHEDLOCK_LOG_FORMAT": "json",
                **p.timings.schedlock_env(),
            }
            sidecars.append(SidecarProcess(f"{target}-{number}", workdir / "sidecars", env).start())
        ctx.say(f"scale: {len(sidecars)} sidecars over {len(targets)} targets starting")
        for sidecar in sidecars:
            await until(sidecar.ready, 300, 0.1, f"{sidecar.name} to be ready")
        ready_s = time.monotonic() - t0
        await until(
            lambda: sum(any(g) for g in _locks(ctx, oid).values()) == keys, 60, 0.1, "every key led"
        )
        led_s = time.monotonic() - t0
        granted: list[int] = []
        waiting: list[int] = []
        for _ in range(SAMPLES):
            for holders in _locks(ctx, oid).values():
                granted.append(sum(holders))
                waiting.append(len(holders) - sum(holders))
            await asyncio.sleep(0.2)
        connections = ctx.env.sql(
            "SELECT coalesce(state, '?'), count(*) FROM pg_stat_activity WHERE datname = %s "
            "GROUP BY 1",
            (dbname,),
        )
        by_state = {str(state): int(n) for state, n in connections}
        total = sum(by_state.values())
        for target in targets:
            insert_due(
                url, prefix=target, count=1, start_at=time.time() + 0.5, spacing=0.0, target=target
            )
        log = DeliveryLog(receiver.log_path)
        await until(
            lambda: len(log.first_arrivals()) >= len(targets), 30, 0.1, "one fire per target"
        )
        await asyncio.sleep(0.5)
        fired = collections.Counter(e.uid for e in log.refresh())
        right_leader = all(e.holder.startswith(e.uid.rsplit("-", 1)[0] + "-") for e in log.entries)
        max_conn = int(ctx.env.sql("SHOW max_connections")[0][0])
        result: dict[str, Any] = {
            "sidecars": len(sidecars),
            "targets": len(targets),
            "keys": keys,
            "samples": SAMPLES,
            "leaders_per_key": {"min": min(granted), "max": max(granted)},
            "waiters_per_key": {"min": min(waiting), "max": max(waiting)},
            "one_leader_per_key": min(granted) == 1 and max(granted) == 1,
            "connections": total,
            "connections_per_sidecar": round(total / len(sidecars), 2),
            "connections_by_state": by_state,
            "max_connections": max_conn,
            "ready_s": round(ready_s, 1),
            "all_keys_led_s": round(led_s, 1),
            "fired_once_per_target": len(fired) == len(targets) and max(fired.values()) == 1,
            "fired_by_own_target": right_leader,
            "rss_mb": summarize([rss_mb(s.pid) or 0.0 for s in sidecars]),
        }
        ctx.results["scale"] = result
        ctx.say(
            f"scale: one leader per key: {result['one_leader_per_key']}, "
            f"{total} connections ({result['connections_per_sidecar']} per sidecar)"
        )
    finally:
        for sidecar in sidecars:
            sidecar.signal(signal.SIGTERM)
        for sidecar in sidecars:
            sidecar.stop()
        receiver.stop()
