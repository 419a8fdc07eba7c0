"""The five systems under test, each as an *instance*: a database, a receiver, N replicas.

An instance knows how to start its replicas, tell which one leads right now (schedlock's own
answer, ``Store.key_status()`` through ``testbed.leaders``; from the lock itself for the
others: ``pg_locks`` for the seed, the Lease object for ``k8s_lease``, ``river_leader`` for
River; procrastinate has no leader), and replace a replica that a scenario killed, as a
Deployment would.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

import psycopg

from bench import kube_client
from bench.env import BenchEnv
from bench.peers import jobs
from bench.profiles import Profile
from schedlock.core.identities import Scheduler, parse_rfc3339
from schedlock.core.logs import Event, records
from schedlock.store.keys import LockKey
from testbed import leaders
from testbed.deliveries import DeliveryLog
from testbed.procs import NamedProcess, children, die_with_parent, stat, status_kb, terminate
from testbed.sidecars import REPO, Deadline, ReceiverProcess, SidecarProcess
from testbed.tools import tool

T = TypeVar("T")
NAMESPACE = "default"
TARGET = "demo"


async def until(
    predicate: Callable[[], T | None],
    timeout: float,
    interval: float = 0.02,
    what: str = "condition",
) -> T:
    """Poll ``predicate`` without blocking the event loop; its first truthy value, or raise."""
    deadline = Deadline(timeout, what)
    while not (value := deadline.poll(predicate)):
        await asyncio.sleep(interval)
    return value


async def together(*calls: Awaitable[None]) -> None:
    """Run side by side; every call runs to its end even if another fails, then the first
    failure is raised (``asyncio.gather`` alone would leave the others running)."""
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome


class Replica(Protocol):
    name: str
    process: subprocess.Popen[bytes] | None

    @property
    def pid(self) -> int: ...

    def alive(self) -> bool: ...

    def ready(self) -> bool: ...

    def signal(self, sig: signal.Signals) -> None: ...

    def stop(self) -> None: ...


def hard_kill(replica: Replica) -> None:
    """SIGKILL (after SIGCONT, in case it is stopped) and reap."""
    process = replica.process
    if process is None:
        return
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGCONT)
            os.kill(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(10)


def rss_mb(pid: int, field: str = "VmRSS") -> float | None:
    """Resident set size (or ``VmHWM``, the peak) of a process, from /proc, in MB."""
    kb = status_kb(pid).get(field)
    return None if kb is None else kb / 1024


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process so far, from /proc/<pid>/stat."""
    found = stat(pid)
    return None if found is None else found.cpu_ticks / os.sysconf("SC_CLK_TCK")


def postgres_cpu_seconds(postmaster: int) -> float:
    """CPU time of the postmaster and all its children (backends, background workers)."""
    return sum(cpu_seconds(pid) or 0.0 for pid in [postmaster, *children(postmaster)])


def acquired_at(log_path: Path, key: str, after: float) -> float | None:
    """When a sidecar logged ``leadership_acquired`` of ``key`` (epoch s), first after ``after``."""
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return None
    for entry in records(text, Event.LEADERSHIP_ACQUIRED):
        if entry.get("key") != key:
            continue
        at = parse_rfc3339(entry["ts"]).timestamp()
        if at >= after:
            return at
    return None


class Worker(NamedProcess):
    """A replica with a status file: ``python -m bench.baselines.<module>`` (a baseline), or
    ``program`` (a peer's worker, bench/peers/)."""

    def __init__(
        self,
        name: str,
        module: str,
        args: list[str],
        workdir: Path,
        program: list[str] | None = None,
    ) -> None:
        self.name = name
        self.module = module
        self.args = args
        self.workdir = workdir
        self.program = program or [sys.executable, "-m", f"bench.baselines.{module}"]
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def status_path(self) -> Path:
        return self.workdir / f"{self.name}.status.json"

    def start(self) -> Worker:
        self.workdir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    *self.program,
                    "--name",
                    self.name,
                    "--status-file",
                    str(self.status_path),
                    *self.args,
                ],
                cwd=REPO,
                stdout=log,
                stderr=log,
                preexec_fn=die_with_parent(),
            )
        return self

    def status(self) -> dict[str, Any]:
        try:
            return dict(json.loads(self.status_path.read_text()))
        except (OSError, ValueError):
            return {}

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def ready(self) -> bool:
        return self.alive() and bool(self.status().get("ready"))

    def signal(self, sig: signal.Signals) -> None:
        if self.alive():
            assert self.process is not None
            self.process.send_signal(sig)

    def stop(self) -> None:
        terminate(self.process, 10, resume=True)


class Instance:
    """One deployment of one system: its own database and receiver, ``replicas`` processes."""

    system = ""
    short = ""
    # False where no replica leads between fires (the seed's tick) or ever (procrastinate).
    standing_leader = True
    # A peer (bench/peers/) fires from every replica the jobs already made available: after a
    # kill, its stream is back with the first delivery of a row due this long after the signal
    # (None: not a peer; the first delivery by another replica ends the gap).
    recovery_horizon_s: float | None = None

    def __init__(
        self,
        env: BenchEnv,
        profile: Profile,
        label: str,
        replicas: int,
        *,
        role_per_replica: bool = False,
        target: str = TARGET,
        namespace: str = NAMESPACE,
    ) -> None:
        self.env = env
        self.profile = profile
        self.timings = profile.timings
        self.label = label
        self.count = replicas
        self.role_per_replica = role_per_replica
        self.target = target
        self.namespace = namespace
        self.dbname = env.new_database(f"{self.short}_{label}")
        self.db_url = env.url(self.dbname)
        self.workdir = env.workdir / self.dbname
        self.receiver = ReceiverProcess(self.workdir / "receiver").start()
        self.log = DeliveryLog(self.receiver.log_path)
        self.replicas: list[Replica] = []
        self._seq = itertools.count()
        self._db_oid = env.database_oid(self.dbname)

    # -- replicas ---------------------------------------------------------------------------

    def next_name(self) -> str:
        return f"{self.short}-{self.label}-{next(self._seq)}".replace("_", "-")[:60]

    def baseline_args(self, name: str) -> list[str]:
        """The flags every baseline worker (bench/baselines/) takes: where, what, for whom."""
        return [
            "--database-url",
            self.replica_url(name),
            "--target-url",
            self.receiver.url,
            "--namespace",
            self.namespace,
            "--target",
            self.target,
        ]

    def replica_url(self, name: str) -> str:
        return self.env.url(self.dbname, role=name if self.role_per_replica else None)

    def spawn(self) -> Replica:
        raise NotImplementedError

    def start(self) -> Instance:
        for _ in range(self.count):
            self.replicas.append(self.spawn())
        return self

    async def wait_ready(self, timeout: float = 120) -> None:
        for replica in list(self.replicas):
            await until(replica.ready, timeout, 0.05, f"{replica.name} to be ready")

    def replace(self, victim: Replica) -> Replica:
        """Kill ``victim`` for good and start a fresh replica in its place."""
        hard_kill(victim)
        self.replicas.remove(victim)
        fresh = self.spawn()
        self.replicas.append(fresh)
        return fresh

    def by_name(self, name: str | None) -> Replica | None:
        return next((r for r in self.replicas if r.name == name), None)

    def stop(self) -> None:
        for replica in self.replicas:  # signal all first: they shut down in parallel
            with contextlib.suppress(Exception):
                replica.signal(signal.SIGCONT)
                replica.signal(signal.SIGTERM)
        for replica in self.replicas:
            with contextlib.suppress(Exception):
                replica.stop()
        self.receiver.stop()

    # -- leadership ---------------------------------------------------------------------------

    def leader_name(self) -> str | None:
        """Who holds the lock (lease) right now, by replica name; None while nobody does."""
        raise NotImplementedError

    def delivered_recently(self, name: str, within: float) -> bool:
        since = time.time() - within
        for entry in reversed(self.log.refresh()[-400:]):
            if entry.arrival < since:
                break
            if entry.holder == name:
                return True
        return False

    async def active_leader(self, timeout: float, within: float = 1.0) -> Replica:
        """The replica that leads and is firing now (it delivered within ``within`` s)."""

        def probe() -> Replica | None:
            replica = self.by_name(self.leader_name())
            if replica is None or not replica.alive():
                return None
            return replica if self.delivered_recently(replica.name, within) else None

        return await until(probe, timeout, 0.02, f"an active {self.system} leader")

    def keys_led(self) -> dict[str, int]:
        """replica name -> number of lock keys it holds right now."""
        leader = self.leader_name()
        return {leader: 1} if leader else {}

    def running_jobs(self, replica: Replica) -> set[int] | None:
        """The peer's jobs ``replica`` is working right now (None: the system has no jobs)."""
        return None

    def still_running(self, jobs: set[int]) -> set[int]:
        """Those of ``jobs`` that are still being worked (or stuck so)."""
        return set()

    def elected_at(self, victim: str, after: float) -> float | None:
        """When a replica other than ``victim`` was elected leader (epoch s), if after ``after``."""
        return None


class SchedlockInstance(Instance):
    system = "schedlock"
    short = "sl"

    def spawn(self) -> Replica:
        name = self.next_name()
        env = {
            "SCHEDLOCK_DATABASE_URL": self.replica_url(name),
            "SCHEDLOCK_NAMESPACE": self.namespace,
            "SCHEDLOCK_TARGET": self.target,
            "SCHEDLOCK_TARGET_URL": self.receiver.url,
            "SCHEDLOCK_LOG_FORMAT": "json",  # timestamps to the millisecond, in UTC
            **self.settings(),
        }
        return SidecarProcess(name, self.workdir / "sidecars", env).start()

    def settings(self) -> dict[str, str]:
        """The sidecars' settings beyond the key and the app (the profile's timings)."""
        return self.timings.schedlock_env()

    def leader_name(self) -> str | None:
        return leaders.leader(self.db_url, LockKey(Scheduler.PUBLISH, self.namespace, self.target))

    def keys_led(self) -> dict[str, int]:
        return leaders.keys_led(self.db_url)


class SeedTickInstance(Instance):
    system = "seed_tick"
    short = "seed"
    standing_leader = False

    def spawn(self) -> Replica:
        name = self.next_name()
        args = [
            *self.baseline_args(name),
            "--tick-seconds",
            f"{self.timings.seed_tick_s:g}",
            "--batch",
            str(self.timings.seed_batch),
        ]
        return Worker(name, "seed_tick", args, self.workdir / "replicas").start()

    def leader_name(self) -> str | None:
        # The seed's only lock in this database: one bigint key (objsubid 1).
        rows = self.env.sql(
            "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.locktype = 'advisory' AND l.granted AND l.database = %s AND l.objsubid = 1",
            (self._db_oid,),
        )
        return str(rows[0][0]) if rows else None

    async def active_leader(self, timeout: float, within: float = 1.0) -> Replica:
        """The replica inside a tick right now (holding the lock while it fires)."""

        def probe() -> Replica | None:
            replica = self.by_name(self.leader_name())
            return replica if replica is not None and replica.alive() else None

        return await until(probe, timeout, 0.004, "a seed_tick replica inside its tick")


class K8sLeaseInstance(Instance):
    system = "k8s_lease"
    short = "k8s"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        kube = self.env.start_kube()
        self.kubeconfig = kube.admin_kubeconfig
        self.lease_name = f"bench-{self.dbname}".replace("_", "-").lower()
        self._api: Any = None

    def spawn(self) -> Replica:
        name = self.next_name()
        t = self.timings
        args = [
            *self.baseline_args(name),
            "--kubeconfig",
            str(self.kubeconfig),
            "--lease-name",
            self.lease_name,
            "--lease-seconds",
            str(int(t.k8s_lease_s)),
            "--renew-deadline-seconds",
            str(int(t.k8s_renew_deadline_s)),
            "--retry-seconds",
            str(int(t.k8s_retry_s)),
            "--poll-seconds",
            f"{t.k8s_poll_s:g}",
        ]
        return Worker(name, "k8s_lease", args, self.workdir / "replicas").start()

    def _coordination(self) -> Any:
        if self._api is None:
            self._api = kube_client.module("client").CoordinationV1Api(
                kube_client.api_client(str(self.kubeconfig))
            )
        return self._api

    def leader_name(self) -> str | None:
        try:
            lease = self._coordination().read_namespaced_lease(self.lease_name, "default")
        except kube_client.api_exception():
            return None
        holder = lease.spec.holder_identity if lease.spec else None
        return str(holder) if holder else None

    async def active_leader(self, timeout: float, within: float = 2.5) -> Replica:
        return await super().active_leader(timeout, within)

    def api_requests(self) -> dict[str, int]:
        return {
            r.name: int(r.status().get("api_requests", 0))
            for r in self.replicas
            if isinstance(r, Worker)
        }


class PeerInstance(Instance):
    """A maintained system run as its users run it (bench/peers/): its own schema migration,
    then one job per ``schedlock_publishes`` row (``bench.peers.jobs``), workers that POST to
    the receiver."""

    recovery_horizon_s: float | None = 0.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._conn: psycopg.Connection[tuple[Any, ...]] | None = None
        subprocess.run(
            [*self.program(), "migrate", "--database-url", self.db_url],
            check=True,
            capture_output=True,
            timeout=120,
        )
        jobs.install(self.db_url, self.system)

    def program(self) -> list[str]:
        raise NotImplementedError

    def spawn(self) -> Replica:
        name = self.next_name()
        args = ["--database-url", self.replica_url(name), "--target-url", self.receiver.url]
        program = [*self.program(), "work"]
        return Worker(name, self.system, args, self.workdir / "replicas", program).start()

    running = ""  # SELECT … WHERE id = ANY(%s) AND <the state of a job being worked>

    def still_running(self, jobs: set[int]) -> set[int]:
        if not jobs:
            return set()
        return {int(row[0]) for row in self.query(self.running, sorted(jobs))}

    def query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        """On this instance's database, over one harness connection (not a replica's role)."""
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.db_url, autocommit=True)
        return self._conn.execute(sql.encode(), params).fetchall()

    def stop(self) -> None:
        super().stop()
        if self._conn is not None:
            self._conn.close()


@functools.cache
def river_bench() -> Path:
    """The River worker, built by hack/tools.sh into the tool cache (once per content)."""
    subprocess.run(["bash", str(REPO / "hack" / "tools.sh"), "ensure", "river-bench"], check=True)
    return tool("river-bench")


class RiverInstance(PeerInstance):
    """River: every client works jobs; the elected leader runs the maintenance services, among
    them the scheduler that makes ``scheduled`` jobs ``available`` (every 5 s)."""

    system = "river"
    short = "river"
    # The scheduler makes available the jobs due within its interval ahead (JobScheduler's
    # look-ahead, JobSchedulerIntervalDefault): the survivors fire those first.
    recovery_horizon_s = 5.0
    running = "SELECT id FROM river_job WHERE id = ANY(%s) AND state = 'running'"

    def program(self) -> list[str]:
        return [str(river_bench())]

    def leader_name(self) -> str | None:
        rows = self.query("SELECT leader_id FROM river_leader WHERE expires_at > now()")
        return str(rows[0][0]) if rows else None

    def running_jobs(self, replica: Replica) -> set[int] | None:
        rows = self.query(
            "SELECT id FROM river_job WHERE state = 'running' "
            "AND attempted_by[cardinality(attempted_by)] = %s",
            replica.name,
        )
        return {int(row[0]) for row in rows}

    def elected_at(self, victim: str, after: float) -> float | None:
        rows = self.query(
            "SELECT extract(epoch FROM elected_at)::float8 FROM river_leader "
            "WHERE leader_id <> %s AND elected_at >= to_timestamp(%s)",
            victim,
            after,
        )
        return float(rows[0][0]) if rows else None


class ProcrastinateInstance(PeerInstance):
    """procrastinate: no leader; each worker fetches due jobs (LISTEN/NOTIFY, polling 5 s)."""

    system = "procrastinate"
    short = "pcr"
    standing_leader = False
    running = "SELECT id FROM procrastinate_jobs WHERE id = ANY(%s) AND status = 'doing'"

    def program(self) -> list[str]:
        return [sys.executable, "-m", "bench.peers.procrastinate_worker"]

    def leader_name(self) -> str | None:
        return None  # no leader: the table says so

    def keys_led(self) -> dict[str, int]:
        return {}

    def running_jobs(self, replica: Replica) -> set[int] | None:
        worker_id = replica.status().get("worker_id") if isinstance(replica, Worker) else None
        rows = self.query(
            "SELECT id FROM procrastinate_jobs WHERE status = 'doing' AND worker_id = %s",
            worker_id,
        )
        return {int(row[0]) for row in rows}

    async def active_leader(self, timeout: float, within: float = 1.0) -> Replica:
        """No leader: a worker at work right now (a job of it in 'doing'), to kill mid-job."""

        def probe() -> Replica | None:
            for replica in self.replicas:
                if replica.alive() and self.running_jobs(replica):
                    return replica
            return None

        return await until(probe, timeout, 0.002, "a procrastinate worker at work")


INSTANCES: dict[str, type[Instance]] = {
    "schedlock": SchedlockInstance,
    "seed_tick": SeedTickInstance,
    "k8s_lease": K8sLeaseInstance,
    "river": RiverInstance,
    "procrastinate": ProcrastinateInstance,
}
