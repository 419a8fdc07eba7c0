"""Idle cost and footprint: 5 replicas of each system, nothing due, one measurement window.

Queries come from PostgreSQL's own statistics: every replica connects as its own role, and
``pg_stat_statements`` counts the statements each role completed in its database between two
snapshots (a standby blocked in ``pg_advisory_lock`` completes nothing; schedlock's reserves,
holding no session, are counted apart: their checks in turns).  The k8s_lease
replicas also count their API requests to the kube-apiserver.  RSS and CPU come from /proc for
the same processes over the same window, and the sessions each replica holds from
``pg_stat_activity`` (by ``application_name``).  All five systems idle side by side.  Then, for
the footprint, schedlock sidecars start one at a time (start to ``/readyz`` 200), and the sizes
of both images built from the Dockerfile are read from their archives.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bench.context import Context
from bench.profiles import PEERS, SYSTEMS
from bench.stats import summarize
from bench.systems import INSTANCES, Instance, K8sLeaseInstance, cpu_seconds, rss_mb, until

KEYS_PER_REPLICA = 2  # a schedlock replica runs the publish and recurring keys of its target
LEADERLESS = ("seed_tick", "procrastinate")  # every replica polls; none leads
START_TRIALS = 5  # schedlock sidecars started one at a time for start_to_ready_s


def _calls(ctx: Context) -> dict[tuple[str, int], int]:
    rows = ctx.env.sql(
        "SELECT r.rolname, s.dbid, sum(s.calls)::bigint FROM pg_stat_statements s "
        "JOIN pg_roles r ON r.oid = s.userid GROUP BY 1, 2"
    )
    return {(str(role), int(dbid)): int(calls) for role, dbid, calls in rows}


def _cpu(insts: dict[str, Instance]) -> dict[str, float]:
    out: dict[str, float] = {}
    for inst in insts.values():
        for r in inst.replicas:
            seconds = cpu_seconds(r.pid)
            if seconds is not None:
                out[r.name] = seconds
    return out


def _api(insts: dict[str, Instance]) -> dict[str, int]:
    inst = insts.get("k8s_lease")
    return inst.api_requests() if isinstance(inst, K8sLeaseInstance) else {}


async def run(ctx: Context, scenarios: list[str]) -> None:
    p = ctx.profile
    insts: dict[str, Instance] = {}
    try:
        for system in (*SYSTEMS, *PEERS):
            insts[system] = INSTANCES[system](
                ctx.env, p, "idle", p.idle_replicas, role_per_replica=True
            ).start()
        for inst in insts.values():
            await inst.wait_ready()
        await until(
            lambda: sum(insts["schedlock"].keys_led().values()) == 2, 60, 0.1, "schedlock leaders"
        )
        await until(insts["k8s_lease"].leader_name, 60, 0.1, "a k8s_lease leader")
        await until(insts["river"].leader_name, 60, 0.1, "a river leader")
        ctx.say(
            f"idle: {len(insts) * p.idle_replicas} replicas up, measuring {p.idle_window_s:g} s"
        )
        await asyncio.sleep(p.idle_warmup_s)
        sessions0 = {s: _sessions(ctx, i.dbname) for s, i in insts.items()}
        calls0, cpu0, api0 = _calls(ctx), _cpu(insts), _api(insts)
        led0 = {s: i.keys_led() for s, i in insts.items()}
        t0 = time.monotonic()
        await asyncio.sleep(p.idle_window_s)
        calls1, cpu1, api1 = _calls(ctx), _cpu(insts), _api(insts)
        window = time.monotonic() - t0
        led1 = {s: i.keys_led() for s, i in insts.items()}
        sessions1 = {s: _sessions(ctx, i.dbname) for s, i in insts.items()}
        for system, inst in insts.items():
            oid = ctx.env.database_oid(inst.dbname)
            stable = led0[system] == led1[system]
            replicas: list[dict[str, Any]] = []
            for r in inst.replicas:
                calls = calls1.get((r.name, oid), 0) - calls0.get((r.name, oid), 0)
                cpu = (cpu1.get(r.name, 0.0) - cpu0.get(r.name, 0.0)) / window * 100
                row: dict[str, Any] = {
                    "name": r.name,
                    "keys_led": led1[system].get(r.name, 0) if system not in LEADERLESS else None,
                    "queries_per_s": round(calls / window, 3),
                    "rss_mb": round(rss_mb(r.pid) or 0.0, 1),
                    "cpu_percent": round(cpu, 2),
                }
                # Sessions held at both ends of the window (the lower, so that a reserve's
                # check caught in flight does not count): a schedlock standby waits on one per
                # key, a reserve holds none; a peer's replica holds its pool's sessions.
                row["sessions"] = min(
                    sessions0[system].get(r.name, 0), sessions1[system].get(r.name, 0)
                )
                if system == "k8s_lease":
                    row["api_requests_per_s"] = round(
                        (api1.get(r.name, 0) - api0.get(r.name, 0)) / window, 3
                    )
                replicas.append(row)
            if "idle_queries_per_s_per_replica" in scenarios:
                ctx.results.setdefault("idle_queries_per_s_per_replica", {})[system] = _idle_entry(
                    system, replicas, window, stable
                )
            if "footprint" in scenarios:
                ctx.results.setdefault("footprint", {})[system] = _footprint_entry(
                    ctx, system, replicas
                )
        if "footprint" in scenarios:
            entry = ctx.results["footprint"]["schedlock"]
            entry["start_to_ready_s"] = await _start_to_ready(ctx, insts["schedlock"])
            entry["image_mb"] = _image_sizes(ctx)
    finally:
        for inst in insts.values():
            inst.stop()


async def _start_to_ready(ctx: Context, inst: Instance) -> dict[str, Any]:
    """From the start of a sidecar process to its first ``/readyz`` 200, one at a time next to
    the idle replicas (its app there, the database migrated): ``START_TRIALS`` fresh replicas,
    polled every 10 ms.  They stay until the instance stops."""
    seconds: list[float] = []
    for _ in range(START_TRIALS):
        started = time.monotonic()
        replica = inst.spawn()
        inst.replicas.append(replica)
        await until(replica.ready, 60, 0.01, f"{replica.name} to be ready")
        seconds.append(time.monotonic() - started)
    ctx.say(f"footprint: start to /readyz 200 {', '.join(f'{s:.2f}' for s in seconds)} s")
    return summarize([round(s, 3) for s in seconds], digits=3)


def _image_sizes(ctx: Context) -> dict[str, Any]:
    """Both images built from the Dockerfile (``hack/images.sh``, cached): MB a node pulls
    (compressed layers and config) and MB unpacked (what ``docker images`` shows)."""
    from testbed.incluster import project_image

    sizes: dict[str, Any] = {}
    for name in ("schedlock", "schedlock-sidecar"):
        try:
            compressed, unpacked = project_image(name).sizes()
        except Exception as exc:  # no root or no buildah here: say so, keep the other figures
            sizes[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            continue
        sizes[name] = {
            "compressed": round(compressed / 1e6, 1),
            "unpacked": round(unpacked / 1e6, 1),
        }
    ctx.say(f"footprint: images {sizes}")
    return sizes


def _sessions(ctx: Context, dbname: str) -> dict[str, int]:
    """application_name (the replica) -> client sessions it holds on ``dbname`` right now."""
    rows = ctx.env.sql(
        "SELECT application_name, count(*) FROM pg_stat_activity WHERE datname = %s "
        "AND backend_type = 'client backend' GROUP BY 1",
        (dbname,),
    )
    return {str(name): int(count) for name, count in rows}


def _idle_entry(
    system: str, replicas: list[dict[str, Any]], window: float, stable: bool
) -> dict[str, Any]:
    entry = summarize([r["queries_per_s"] for r in replicas], digits=3)
    entry["window_s"] = round(window, 1)
    entry["source"] = "pg_stat_statements calls per replica role"
    if system == "seed_tick":
        entry["note"] = "no standing leader: every replica ticks and tries the lock"
    elif system == "procrastinate":
        entry["note"] = "no leader: every worker LISTENs and polls (5 s), heartbeats (10 s)"
    else:
        leaders = [r for r in replicas if r["keys_led"]]
        followers = [r for r in replicas if not r["keys_led"]]
        if system == "schedlock":
            # Standbys wait on one session for both keys (the target's leadership lock) and
            # issue nothing; reserves hold no session and check in turns, at a cost bounded
            # per key whatever their number.
            reserves = [r for r in followers if not r["sessions"]]
            followers = [r for r in followers if r["sessions"]]
            entry["reserves"] = len(reserves)
            entry["reserves_queries_per_s_per_key"] = round(
                sum(r["queries_per_s"] for r in reserves) / KEYS_PER_REPLICA, 3
            )
        entry["leader_keys_stable"] = stable
        entry["keys"] = sum(r["keys_led"] for r in leaders)
        entry["leader_queries_per_s_per_key"] = (
            round(sum(r["queries_per_s"] for r in leaders) / entry["keys"], 3)
            if entry["keys"]
            else None
        )
        entry["followers_queries_per_s_max"] = max(
            (r["queries_per_s"] for r in followers), default=None
        )
        if system == "k8s_lease":
            entry["api_requests_per_s_leader"] = max(
                (r["api_requests_per_s"] for r in leaders), default=None
            )
            entry["api_requests_per_s_followers_max"] = max(
                (r["api_requests_per_s"] for r in followers), default=None
            )
    entry["replicas"] = [
        {k: v for k, v in r.items() if k not in ("rss_mb", "cpu_percent")} for r in replicas
    ]
    return entry


def _footprint_entry(ctx: Context, system: str, replicas: list[dict[str, Any]]) -> dict[str, Any]:
    leaders = [r for r in replicas if r["keys_led"]]
    entry: dict[str, Any] = {
        "rss_mb": summarize([r["rss_mb"] for r in replicas]),
        "idle_cpu_percent": summarize([r["cpu_percent"] for r in replicas], digits=2),
        "leader_rss_mb": leaders[0]["rss_mb"] if leaders else None,
        "leader_idle_cpu_percent": leaders[0]["cpu_percent"] if leaders else None,
    }
    if replicas:
        entry["sessions"] = summarize([r["sessions"] for r in replicas])
    if system == "schedlock":
        peaks = ctx.extras.get("peak_rss_mb") or []
        entry["peak_rss_under_load_mb"] = round(max(peaks), 1) if peaks else None
    return entry
