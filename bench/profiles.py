"""How big each run is: ``full`` (``make bench``), ``quick`` (``make bench-quick``) and ``smoke``.

Full and quick use every product default (schedlock's 10 s lease, client-go's 15/10/2 s Lease
timings, the seed's 10 s tick, River's and procrastinate's own); they differ only in trials and
sizes.  Smoke exists so the
harness cannot rot (``tests/e2e/test_bench_smoke.py``): one short trial per scenario with
shortened timings — its numbers mean nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SYSTEMS = ("schedlock", "seed_tick", "k8s_lease")
# The maintained systems a user would pick instead (bench/peers/), run with their own defaults
# whatever the profile: the smoke cannot shorten their timings, only their trials.
PEERS = ("river", "procrastinate")


@dataclass(frozen=True)
class Timings:
    """The settings each system runs with (recorded in the results)."""

    schedlock_lease_s: float = 10.0  # SCHEDLOCK_LEASE_SECONDS default
    schedlock_heartbeat_s: float = 3.0  # SCHEDLOCK_HEARTBEAT_SECONDS default
    seed_tick_s: float = 10.0  # the seed's tick
    seed_batch: int = 25  # rows fired per tick
    k8s_lease_s: float = 15.0  # client-go LeaseDuration default
    k8s_renew_deadline_s: float = 10.0  # client-go RenewDeadline default
    k8s_retry_s: float = 2.0  # client-go RetryPeriod default
    k8s_poll_s: float = 1.0  # how often the k8s_lease leader looks for due rows
    schedlock_reserve_check_s: float = 5.0  # SCHEDLOCK_RESERVE_CHECK_SECONDS default

    def schedlock_env(self) -> dict[str, str]:
        defaults = Timings()
        env: dict[str, str] = {}
        if self.schedlock_reserve_check_s != defaults.schedlock_reserve_check_s:
            env["SCHEDLOCK_RESERVE_CHECK_SECONDS"] = f"{self.schedlock_reserve_check_s:g}"
        if self.schedlock_lease_s != defaults.schedlock_lease_s:
            env["SCHEDLOCK_LEASE_SECONDS"] = f"{self.schedlock_lease_s:g}"
        if self.schedlock_heartbeat_s != defaults.schedlock_heartbeat_s:
            env["SCHEDLOCK_HEARTBEAT_SECONDS"] = f"{self.schedlock_heartbeat_s:g}"
        return env


@dataclass(frozen=True)
class Profile:
    name: str
    timings: Timings = field(default_factory=Timings)
    replicas: int = 3  # replicas per system in failover, lateness and throughput
    row_spacing_s: float = 0.01  # failover: rows due every 10 ms
    sigkill_trials: dict[str, int] = field(default_factory=dict)
    sigstop_trials: dict[str, int] = field(default_factory=dict)
    sigterm_trials: int = 1
    baseline_gap_cap_s: float = 40.0  # longest wait for a baseline's first delivery after a kill
    seed_sigstop_cap_s: float = 30.0  # a frozen seed replica keeps its lock: bounded wait
    # procrastinate has no leader: the other workers go on at once; the wait only bounds a
    # trial whose survivors do not (its stuck rows are counted, not waited for)
    peer_no_leader_cap_s: float = 10.0
    lateness_rows: int = 5000
    lateness_span_s: float = 60.0
    lateness_drain_s: float = 15.0  # after the last due time, how long arrivals are awaited
    throughput_rows: int = 20000
    throughput_cap_s: float = 60.0
    throughput_trials: int = 3  # schedlock; the baselines run once (they hit the cap)
    idle_replicas: int = 5
    idle_warmup_s: float = 5.0
    idle_window_s: float = 30.0
    operator_objects: int = 1000
    operator_cap_s: float = 240.0
    operator_10k_objects: int = 10_000  # objects present when the operator restarts
    operator_10k_namespaces: int = 100  # … spread over this many namespaces
    operator_10k_burst: int = 1000  # new objects created with them present
    operator_10k_cap_s: float = 1200.0  # longest wait for each step (ingest, resume, burst)
    scale_replicas: tuple[int, ...] = (5, 20, 50)  # replicas of one target, per design
    scale_window_s: float = 30.0  # quiet window for new connections/s and statements/s
    scale_failover_trials: int = 5  # SIGKILLs of the leader per design and replica count
    scale_settled: bool = True  # measure again after one rotation of the reserves' turns
    # scale_targets: many targets' sidecars on one database next to an app's pool (issue 22)
    scale_targets_count: int = 50  # targets
    scale_targets_replicas: int = 2  # sidecars per target
    scale_targets_max_connections: int = 150  # the scenario's own PostgreSQL
    scale_targets_app_pool: int = 40  # idle connections an app holds, opened first
    scale_targets_stagger_s: float = 0.3  # between two sidecars' starts
    scale_targets_window_s: float = 30.0  # quiet window for new connections/s
    scale_targets_kill_trials: int = 10  # SIGKILLs of a leader whose standby is alive
    scale_targets_kill_both_trials: int = 5  # SIGKILLs of a target's leader and standby
    cluster_trials: int = 10  # leader pod deletions of each kind; a third as many rolling updates
    history_rows: int = 5_000_000  # finished rows in the loaded database (the 5 M)
    history_keys: int = 400  # lock keys they are spread over
    history_lateness_rows: int = 500  # per trial, due evenly over the span, on one key
    history_lateness_span_s: float = 10.0
    history_lateness_trials: int = 3
    history_throughput_rows: int = 5000
    history_cap_s: float = 300.0  # longest wait for `schedlock status`, key_status, the sweep
    history_backlog_rows: int = 2_000_000  # expired rows the pruner clears
    history_prune_cap_s: float = 900.0  # longest wait for the backlog to clear (target 600 s)
    tenancy_trials: int = 3  # turns of the three modes (owner, every namespace, one namespace)
    tenancy_lateness_rows: int = 1000  # per trial and mode, due evenly over the span
    tenancy_lateness_span_s: float = 10.0
    tenancy_throughput_rows: int = 5000  # per trial and mode, due at once


FULL = Profile(
    name="full",
    sigkill_trials={
        "schedlock": 50,
        "seed_tick": 10,
        "k8s_lease": 8,
        "river": 8,
        "procrastinate": 10,
    },
    sigstop_trials={
        "schedlock": 12,
        "seed_tick": 4,
        "k8s_lease": 6,
        "river": 4,
        "procrastinate": 4,
    },
    sigterm_trials=30,
)

QUICK = Profile(
    name="quick",
    sigkill_trials={"schedlock": 8, "seed_tick": 2, "k8s_lease": 1, "river": 2, "procrastinate": 3},
    sigstop_trials={"schedlock": 1, "seed_tick": 1, "k8s_lease": 1, "river": 1, "procrastinate": 1},
    sigterm_trials=8,
    seed_sigstop_cap_s=15.0,
    lateness_rows=1000,
    lateness_span_s=10.0,
    lateness_drain_s=4.0,
    throughput_rows=5000,
    throughput_cap_s=10.0,
    throughput_trials=1,
    idle_warmup_s=3.0,
    idle_window_s=10.0,
    operator_objects=200,
    operator_cap_s=120.0,
    operator_10k_objects=2000,
    operator_10k_namespaces=20,
    operator_10k_burst=200,
    scale_window_s=10.0,
    scale_failover_trials=2,
    scale_settled=False,
    # half the size: 25 x 2 next to a pool of 20 at max_connections 80 (the same headroom)
    scale_targets_count=25,
    scale_targets_max_connections=80,
    scale_targets_app_pool=20,
    scale_targets_window_s=10.0,
    scale_targets_kill_trials=4,
    scale_targets_kill_both_trials=2,
    cluster_trials=3,
    history_rows=500_000,
    history_lateness_trials=1,
    history_throughput_rows=2000,
    history_cap_s=120.0,
    history_backlog_rows=200_000,
    history_prune_cap_s=300.0,
    tenancy_trials=1,
)

SMOKE = Profile(
    name="smoke",
    timings=Timings(
        schedlock_lease_s=3.0,
        schedlock_heartbeat_s=1.0,
        seed_tick_s=2.0,
        k8s_lease_s=4.0,
        k8s_renew_deadline_s=3.0,
        k8s_retry_s=1.0,
        schedlock_reserve_check_s=1.0,
    ),
    replicas=2,
    sigkill_trials={"schedlock": 1, "seed_tick": 1, "k8s_lease": 1, "river": 1, "procrastinate": 1},
    sigstop_trials={"schedlock": 1, "seed_tick": 1, "k8s_lease": 1, "river": 1, "procrastinate": 1},
    sigterm_trials=1,
    baseline_gap_cap_s=12.0,
    peer_no_leader_cap_s=3.0,
    seed_sigstop_cap_s=3.0,
    lateness_rows=60,
    lateness_span_s=1.5,
    lateness_drain_s=2.5,
    throughput_rows=200,
    throughput_cap_s=4.0,
    throughput_trials=1,
    idle_replicas=2,
    idle_warmup_s=1.0,
    idle_window_s=2.0,
    operator_objects=5,
    operator_cap_s=60.0,
    operator_10k_objects=20,
    operator_10k_namespaces=2,
    operator_10k_burst=5,
    operator_10k_cap_s=60.0,
    scale_replicas=(4,),
    scale_window_s=2.0,
    scale_failover_trials=1,
    scale_settled=False,
    scale_targets_count=3,
    scale_targets_max_connections=30,
    scale_targets_app_pool=4,
    scale_targets_stagger_s=0.1,
    scale_targets_window_s=2.0,
    scale_targets_kill_trials=1,
    scale_targets_kill_both_trials=1,
    cluster_trials=1,
    history_rows=20_000,
    history_keys=20,
    history_lateness_rows=50,
    history_lateness_span_s=1.5,
    history_lateness_trials=1,
    history_throughput_rows=200,
    history_cap_s=60.0,
    history_backlog_rows=8000,
    history_prune_cap_s=60.0,
    tenancy_trials=1,
    tenancy_lateness_rows=50,
    tenancy_lateness_span_s=1.5,
    tenancy_throughput_rows=200,
)

PROFILES = {p.name: p for p in (FULL, QUICK, SMOKE)}
