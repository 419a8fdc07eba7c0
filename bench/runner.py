"""One benchmark run: set up the test bed, run the scenarios in a fixed order, report.

Order and grouping (what may share the machine with what):

1. failover — schedlock's SIGKILL and SIGTERM trials alone (milliseconds are at stake); then
   schedlock's SIGSTOP trials, both baselines' and both peers' trials side by side (all
   seconds long);
2. lateness — schedlock alone, then the two baselines and the two peers side by side;
3. throughput — schedlock alone, then the two baselines side by side, then each peer alone;
4. idle queries and footprint — all five systems idling side by side, one window;
5. operator — the burst of ScheduledPublish objects; operator_10k — a restart of the
   operator with 10,000 objects present, a re-assertion pass, a burst on top;
6. scale — 5, 20 and 50 replicas of one target at max_connections 100, bounded vs baseline;
   scale_targets — 50 targets × 2 replicas on one database at max_connections 150 next to an
   app pool of 40 (a PostgreSQL of its own);
7. history — the hot paths with 0 and with 5 M finished rows on one server, the prune backlog;
8. tenancy — one key's lateness and throughput as the owner and under row-level security;
9. cluster — the product in a real one-node cluster: leader pods deleted, a rolling update.

A run of some scenarios only (``--only``) into a results directory that holds an earlier run
replaces those scenarios' keys and keeps the others (``report.merge_partial``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import platform
import shutil
import signal
import subprocess
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

from bench import peers, report
from bench.context import Context
from bench.env import BenchEnv
from bench.profiles import PROFILES, Profile
from bench.scenarios import (
    cluster,
    failover,
    history,
    idle,
    lateness,
    operator,
    operator_10k,
    scale,
    scale_targets,
    tenancy,
    throughput,
)
from testbed.sidecars import REPO

RESULTS = REPO / "bench" / "results"
SCENARIOS = report.KEYS
FAILOVER = ("failover_sigkill_ms", "failover_sigstop_ms", "handover_sigterm_ms")
IDLE = ("idle_queries_per_s_per_replica", "footprint")
NEEDS_KUBE = (
    *FAILOVER,
    "lateness_ms",
    "throughput_fires_per_s",
    *IDLE,
    "operator",
    "operator_10k",
)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _first_line(command: list[str]) -> str | None:
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (out.stdout or out.stderr).strip()
    return text.splitlines()[0] if text else None


def machine(env: BenchEnv, profile: Profile) -> dict[str, Any]:
    cpu_model = None
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    mem_gb = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        meminfo = Path("/proc/meminfo").read_text().splitlines()[0]
        mem_gb = round(int(meminfo.split()[1]) / 1024 / 1024, 1)
    import kubernetes
    import psycopg

    kube_version = None
    if env.kube is not None:
        kube_version = _first_line([str(env.kube.apiserver_bin), "--version"])
    commit = _first_line(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"])
    dirty = bool(_first_line(["git", "-C", str(REPO), "status", "--porcelain"]))
    return {
        "cpu_model": cpu_model,
        "cpus": os.cpu_count(),
        "memory_gb": mem_gb,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "postgres": env.server_version(),
        "kube_apiserver": kube_version,
        "kubernetes_client": kubernetes.__version__,
        "psycopg": psycopg.__version__,
        "peers": peers.versions(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "profile": profile.name,
        "timings": {k: v for k, v in vars(profile.timings).items() if not k.startswith("_")},
        "replicas": profile.replicas,
        "commit": f"{commit}{'-dirty' if dirty else ''}" if commit else None,
    }


async def _scenarios(ctx: Context, only: list[str], errors: list[str]) -> None:
    async def guarded(name: str, call: Callable[[], Awaitable[None] | None]) -> None:
        try:
            result = call()
            if result is not None:
                await result
        except (KeyboardInterrupt, asyncio.CancelledError):
            raise
        except Exception as exc:  # one broken scenario must not hide the others' numbers
            errors.append(f"{name}: {type(exc).__name__}: {exc}")
            ctx.say(f"{name} FAILED:\n{traceback.format_exc()}")

    # Scenario families in the order they run; each gets the keys of it that were asked for.
    families: list[tuple[str, tuple[str, ...], Callable[[list[str]], Awaitable[None] | None]]] = [
        ("failover", FAILOVER, lambda keys: failover.run(ctx, keys)),
        ("lateness", ("lateness_ms",), lambda _: lateness.run(ctx)),
        ("throughput", ("throughput_fires_per_s",), lambda _: throughput.run(ctx)),
        ("idle", IDLE, lambda keys: idle.run(ctx, keys)),
        ("operator", ("operator",), lambda _: operator.run(ctx)),
        ("operator_10k", ("operator_10k",), lambda _: operator_10k.run(ctx)),
        ("scale", ("scale",), lambda _: scale.run(ctx)),
        ("scale_targets", ("scale_targets",), lambda _: scale_targets.run(ctx)),
        ("history", ("history",), lambda _: history.run(ctx)),
        ("tenancy", ("tenancy",), lambda _: tenancy.run(ctx)),
        ("cluster", ("cluster",), lambda _: cluster.run(ctx)),
    ]
    for family, keys, start in families:
        wanted = [key for key in keys if key in only]
        if wanted:
            await guarded(family, functools.partial(start, wanted))


def run(
    *, profile_name: str, only: list[str], out: Path, write_docs: bool | None, keep: bool
) -> int:
    profile = PROFILES[profile_name]
    if write_docs is None:
        write_docs = profile.name == "full" and set(only) == set(SCENARIOS)
    signal.signal(signal.SIGTERM, _interrupt)
    workdir = Path(tempfile.mkdtemp(prefix="schedlock-bench-"))
    workdir.chmod(0o755)
    env = BenchEnv(workdir)
    ctx = Context(env=env, profile=profile)
    errors: list[str] = []
    started = time.monotonic()
    when = datetime.now(UTC)
    info: dict[str, Any] = {}
    ok = False
    try:
        ctx.say(f"profile {profile.name}: {', '.join(only)} (work directory {workdir})")
        env.start()
        if any(s in NEEDS_KUBE for s in only):
            env.start_kube()
        info = machine(env, profile)
        asyncio.run(_scenarios(ctx, only, errors))
        ok = not errors
    except KeyboardInterrupt:
        ctx.say("interrupted: cleaning up")
        return 130
    finally:
        env.close()
        if keep or not ok:
            ctx.say(f"kept the work directory (logs): {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    info["run_seconds"] = round(time.monotonic() - started, 1)
    info["scenarios"] = only
    document = report.document(info, when, ctx.results)
    previous = out / "latest.json"
    if set(only) != set(SCENARIOS) and previous.exists():
        document = report.merge_partial(json.loads(previous.read_text()), document, only)
    table = report.table(document)
    print(table)
    print(report.history_table(document))
    print(report.tenancy_table(document))
    print(report.scale_targets_table(document))
    print(report.operator_10k_table(document))
    report.write(out, document, table, ctx.series, ctx.censored)
    if write_docs:
        if set(only) - set(report.OWN_BLOCKS):
            report.write_docs(document, table)
            ctx.say("wrote the table into docs/performance.md")
        for key in report.OWN_BLOCKS:
            if key in only and document.get(key):
                report.write_own_block(document, key)
                ctx.say(f"wrote the {key} table into docs/performance.md")
    ctx.say(f"done in {info['run_seconds']:.0f} s; results in {out}")
    if errors:
        for error in errors:
            ctx.say(f"error: {error}")
        return 1
    return 0
