"""The soak's loop: load, kills and restarts, a sample every ``interval_s``, the outputs.

The load, all on one target (``demo``) led by one of three sidecars:

* ``schedules`` recurring schedules ``@every 1s`` (stored as ``schedlock schedule`` stores them);
* one-shot rows inserted continuously, ``one_shots_per_s`` a second, each due a few seconds
  after it is written (:class:`bench.rows.RowStream`, as any writer would insert them);
* with the operator: ``object_schedules`` ScheduledPublish objects on a cron (``* * * * *``:
  objects take 5-field cron only) and a one-shot object every ``object_every_s``, deleted
  again ``object_keep_s`` after it was created (so etcd's history stays bounded too).

Sidecars and the operator prune history after 5 minutes (:data:`RETENTION`): the tables fill
for that long and must be level after the warm-up (``warmup_fraction`` of the run).

Every ``kill_every_s`` the leader is SIGKILLed (a standby, in turn, when no sidecar leads at
that moment) and started again ``restart_after_s`` later, so every kill is a hand-over.  A
restarted process starts its memory afresh: a sidecar's RSS is judged from its last start on
(plus :data:`SETTLE_S`), and the plot shows the drop at each restart.

Outputs in ``out``: ``samples.csv`` (``elapsed_s,series,value``), ``summary.json`` (the
configuration, the kills, every series' trend and the overall verdict) and ``soak.png``.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import signal
import tempfile
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

from bench.rows import RowStream
from bench.soak import plot
from bench.soak.sample import Sampler
from bench.soak.stack import NAMESPACE, TARGET, SoakStack, kube_tools_built
from bench.soak.trends import Point, Trend, overall, render, trend
from schedlock.core.identities import rfc3339
from testbed.sidecars import REPO, SidecarProcess

RESULTS = REPO / "bench" / "results" / "soak"
# A short retention, so that an hour's history is pruned many times over and the tables must
# level off (a tree without the pruner ignores these settings: its tables grow, and say so).
RETENTION = {
    "SCHEDLOCK_RETENTION_SECONDS": "300",
    "SCHEDLOCK_FAILED_RETENTION_SECONDS": "300",
    "SCHEDLOCK_PRUNE_INTERVAL_SECONDS": "30",
}
TICK_S = 0.25
SETTLE_S = 60.0  # a restarted sidecar's memory is judged this long after its start


@dataclass(frozen=True)
class SoakConfig:
    duration_s: float = 3600.0
    interval_s: float = 15.0  # between two samples
    kill_every_s: float = 120.0
    restart_after_s: float = 5.0
    schedules: int = 5  # "@every 1s"
    one_shots_per_s: float = 5.0
    operator: str = "auto"  # auto: when kube-apiserver and etcd are built; on; off
    object_schedules: int = 2
    object_every_s: float = 10.0
    object_keep_s: float = 120.0
    warmup_fraction: float = 0.25  # samples before this share of the run are not judged
    sidecar_env: dict[str, str] = field(default_factory=lambda: dict(RETENTION))
    operator_env: dict[str, str] = field(default_factory=lambda: dict(RETENTION))

    @property
    def warmup_s(self) -> float:
        return self.duration_s * self.warmup_fraction


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def say(message: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {message}", flush=True)


@dataclass
class Kills:
    """SIGKILLs the leader every ``kill_every_s`` and restarts it ``restart_after_s`` later."""

    stack: SoakStack
    config: SoakConfig
    events: list[dict[str, Any]] = field(default_factory=list)
    pending: dict[str, float] = field(default_factory=dict)  # name -> when to restart
    started: dict[str, float] = field(default_factory=dict)  # name -> last start (elapsed s)
    next_kill: float = 0.0
    turn: int = 0

    def __post_init__(self) -> None:
        self.next_kill = time.monotonic() + self.config.kill_every_s

    def step(self, t0: float) -> None:
        now = time.monotonic()
        for sidecar in self.stack.sidecars:
            due = self.pending.get(sidecar.name)
            if due is not None and now >= due:
                sidecar.start()
                del self.pending[sidecar.name]
                self.started[sidecar.name] = now - t0
                self.events.append({"t": round(now - t0, 1), "restarted": sidecar.name})
        if now < self.next_kill:
            return
        self.next_kill = now + self.config.kill_every_s
        alive = [s for s in self.stack.sidecars if s.alive() and s.name not in self.pending]
        if len(alive) < 2:  # keep one running: a kill is a hand-over, not an outage
            return
        leaders = [s for s in alive if _leads(s)]
        victim = leaders[0] if leaders else alive[self.turn % len(alive)]
        self.turn += 1
        assert victim.process is not None
        victim.process.kill()
        victim.process.wait(10)
        self.pending[victim.name] = now + self.config.restart_after_s
        self.events.append(
            {"t": round(now - t0, 1), "killed": victim.name, "leader": bool(leaders)}
        )
        say(f"SIGKILL {victim.name}{' (the leader)' if leaders else ''}")

    def judged_from(self, warmup_s: float) -> dict[str, float]:
        """Per sidecar RSS series, when its judged window starts (its last start, settled)."""
        return {
            f"rss_mb/{name}": max(warmup_s, started + SETTLE_S)
            for name, started in self.started.items()
        }


def _leads(sidecar: SidecarProcess) -> bool:
    try:
        return sidecar.leads("publish") or sidecar.leads("recurring")
    except Exception:  # a sidecar busy starting may not answer: not a leader then
        return False


@dataclass
class Objects:
    """ScheduledPublish objects: cron ones made once, one-shots made and deleted in turn."""

    stack: SoakStack
    config: SoakConfig
    made: dict[str, float] = field(default_factory=dict)  # one-shot name -> when created
    count: int = 0
    refused: int = 0
    next_at: float = 0.0

    def start(self) -> None:
        for i in range(self.config.object_schedules):
            if not self.stack.apply_object(f"cron-{i}", {"schedule": "* * * * *"}):
                raise RuntimeError(f"the API server refused the ScheduledPublish cron-{i}")
        self.next_at = time.monotonic()

    def step(self) -> None:
        now = time.monotonic()
        for name, made_at in list(self.made.items()):
            if now - made_at > self.config.object_keep_s:
                self.stack.delete_object(name)
                del self.made[name]
        if now < self.next_at:
            return
        self.next_at = now + self.config.object_every_s
        name = f"once-{self.count}"
        self.count += 1
        at = rfc3339(datetime.fromtimestamp(time.time() + 5, UTC), "microseconds")
        if self.stack.apply_object(name, {"publishAt": at}):
            self.made[name] = now
        else:
            self.refused += 1


def _with_operator(config: SoakConfig) -> bool:
    if config.operator == "auto":
        return kube_tools_built()
    return config.operator == "on"


def soak(config: SoakConfig, out: Path = RESULTS, workdir: Path | None = None) -> dict[str, Any]:
    """Run the soak for ``config.duration_s`` and write its outputs into ``out``; returns the
    summary.  Every process it started is stopped before it returns, however it ends."""
    rundir = workdir or Path(tempfile.mkdtemp(prefix="schedlock-soak-"))
    rundir.mkdir(parents=True, exist_ok=True)
    rundir.chmod(0o755)  # as root, PostgreSQL runs as its own user and must reach its files
    out.mkdir(parents=True, exist_ok=True)
    with_operator = _with_operator(config)
    stack = SoakStack(rundir, sidecar_env=config.sidecar_env, operator_env=config.operator_env)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    samples: list[tuple[float, str, float]] = []
    kills: Kills | None = None
    objects: Objects | None = None
    stream: RowStream | None = None
    sampler: Sampler | None = None
    started = datetime.now(UTC)
    interrupted = False
    try:
        say(f"starting (work directory {rundir}; operator {'on' if with_operator else 'off'})")
        stack.start(with_operator=with_operator)
        stack.add_schedules(config.schedules)
        if with_operator:
            objects = Objects(stack, config)
            objects.start()
        stream = RowStream(
            stack.admin_url + "?application_name=soak-rows",
            prefix="soak",
            spacing=1 / config.one_shots_per_s,
            namespace=NAMESPACE,
            target=TARGET,
        )
        sampler = Sampler(stack.admin_url, stack.receiver.log_path)
        t0 = time.monotonic()
        kills = Kills(stack, config)
        deadline = t0 + config.duration_s
        next_sample = t0 + config.interval_s
        last_sample = t0
        say(f"running for {config.duration_s:g} s, a sample every {config.interval_s:g} s")
        while (now := time.monotonic()) < deadline:
            stream.top_up()
            kills.step(t0)
            if objects is not None:
                objects.step()
            if now >= next_sample:
                postmaster = stack.pg.process.pid if stack.pg.process else None
                values = sampler.sample(now - last_sample, stack.processes(), postmaster)
                elapsed = round(now - t0, 1)
                samples += [(elapsed, name, value) for name, value in sorted(values.items())]
                last_sample, next_sample = now, next_sample + config.interval_s
            time.sleep(TICK_S)
    except KeyboardInterrupt:
        interrupted = True
        say("interrupted: cleaning up and writing what was sampled")
    finally:
        signal.signal(signal.SIGTERM, previous)
        if stream is not None:
            stream.close()
        if sampler is not None:
            sampler.close()
        stack.stop()
    summary = _summary(config, started, with_operator, samples, kills, objects, interrupted)
    _write(out, samples, summary)
    say(f"verdict: {summary['verdict']}; outputs in {out}")
    if not interrupted and workdir is None:
        import shutil

        shutil.rmtree(rundir, ignore_errors=True)
    return summary


def trends_of(
    samples: list[tuple[float, str, float]],
    warmup_s: float,
    judged_from: dict[str, float] | None = None,
) -> list[Trend]:
    """Every series' trend, judged after ``warmup_s`` (or its own start in ``judged_from``)."""
    by_series: dict[str, list[Point]] = defaultdict(list)
    for elapsed, name, value in samples:
        by_series[name].append((elapsed, value))
    starts = judged_from or {}
    return [
        trend(name, points, warmup_s=starts.get(name, warmup_s))
        for name, points in sorted(by_series.items())
    ]


def _summary(
    config: SoakConfig,
    started: datetime,
    with_operator: bool,
    samples: list[tuple[float, str, float]],
    kills: Kills | None,
    objects: Objects | None,
    interrupted: bool,
) -> dict[str, Any]:
    judged_from = kills.judged_from(config.warmup_s) if kills is not None else {}
    trends = trends_of(samples, config.warmup_s, judged_from)
    events = kills.events if kills is not None else []
    return {
        "started": started.isoformat(timespec="seconds"),
        "config": asdict(config),
        "operator": with_operator,
        "pruner": importlib.util.find_spec("schedlock.store.retention") is not None,
        "interrupted": interrupted,
        "samples": len({t for t, _, _ in samples}),
        "kills": sum(1 for e in events if "killed" in e),
        "leader_kills": sum(1 for e in events if e.get("leader")),
        "restarts": sum(1 for e in events if "restarted" in e),
        "events": events,
        "objects_created": objects.count if objects is not None else 0,
        "objects_refused": objects.refused if objects is not None else 0,
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count(),
        "verdict": overall(trends),
        "growing": [t.series for t in trends if t.gating and t.verdict == "grows"],
        "trends": [t.as_json() for t in trends],
        "table": render(trends),
    }


def _write(out: Path, samples: list[tuple[float, str, float]], summary: dict[str, Any]) -> None:
    with (out / "samples.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["elapsed_s", "series", "value"])
        writer.writerows((t, name, f"{value:.6g}") for t, name, value in samples)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "summary.md").write_text(summary["table"] + "\n")
    plot.write(out / "soak.png", samples, summary)
