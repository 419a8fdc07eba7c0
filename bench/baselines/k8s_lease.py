"""Baseline ``k8s_lease``: leader election on a Kubernetes Lease, as the official client does it.

Every replica runs ``kubernetes.leaderelection.LeaderElection`` with a ``LeaseLock`` against the
API server, with client-go's default timings (lease 15 s, renew deadline 10 s, retry 2 s).  The
leader's ``onstarted_leading`` callback fires due rows while it leads: it reads up to 100 due
rows, POSTs them one by one and marks each, and looks again after ``--poll-seconds`` (1 s)
when nothing was due.  Losing the lease stops the loop; the replica then campaigns again.

The API calls each replica makes (get, create, update of the Lease) are counted into the
status file, so the idle scenario can report the election's own cost next to its queries.

``python -m bench.baselines.k8s_lease --name N --database-url U --target-url T
--kubeconfig K --lease-name L --status-file F``
"""

from __future__ import annotations

import argparse
import logging
import threading
import time
from typing import Any

import psycopg

from bench.baselines.common import Firer, Status, start
from bench.kube_client import module

# The client's leader election, as shipped (untyped, hence reached through ``module``).
LeaseLock: Any = module("leaderelection.resourcelock.leaselock").LeaseLock
electionconfig: Any = module("leaderelection.electionconfig")
leaderelection: Any = module("leaderelection.leaderelection")

BATCH = 100


class CountingLeaseLock(LeaseLock):  # type: ignore[misc]
    """LeaseLock that counts its API requests (one per get, create or update)."""

    def __init__(self, name: str, namespace: str, identity: str, status: Status) -> None:
        super().__init__(name, namespace, identity)
        self.status = status
        self.requests = 0

    def _count(self) -> None:
        self.requests += 1
        self.status.update(api_requests=self.requests)

    def get(self, name: str, namespace: str) -> Any:
        self._count()
        return super().get(name, namespace)

    def create(self, name: str, namespace: str, election_record: Any) -> Any:
        self._count()
        return super().create(name, namespace, election_record)

    def update(self, name: str, namespace: str, updated_record: Any) -> Any:
        self._count()
        return super().update(name, namespace, updated_record)


class Leader:
    """The work done while leading; stops as soon as ``onstopped_leading`` is called."""

    def __init__(self, args: argparse.Namespace, status: Status) -> None:
        self.args = args
        self.status = status
        self.firer = Firer(args.name, args.target_url)
        self.leading = threading.Event()
        self.generation = 0
        self.conn: psycopg.Connection[Any] | None = None

    def _connection(self) -> psycopg.Connection[Any]:
        if self.conn is None or self.conn.closed:
            self.conn = psycopg.connect(
                self.args.database_url, autocommit=True, application_name=self.args.name
            )
        return self.conn

    def started(self) -> None:
        self.generation += 1
        mine = self.generation
        self.leading.set()
        self.status.update(leading=True)
        while self.leading.is_set() and self.generation == mine:
            conn = self._connection()
            rows = self.firer.due(conn, self.args.namespace, self.args.target, BATCH)
            for row in rows:
                if not self.leading.is_set():
                    break
                self.firer.fire(conn, row)
            self.status.update(fires=self.firer.fires)
            if len(rows) < BATCH:
                time.sleep(self.args.poll_seconds)

    def stopped(self) -> None:
        self.leading.clear()
        self.status.update(leading=False)


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--lease-name", required=True)
    parser.add_argument("--lease-namespace", default="default")
    # Whole seconds: the client writes the lease duration into the Lease as an integer.
    parser.add_argument("--lease-seconds", type=int, default=15)
    parser.add_argument("--renew-deadline-seconds", type=int, default=10)
    parser.add_argument("--retry-seconds", type=int, default=2)
    parser.add_argument("--poll-seconds", type=float, default=1.0)


def main() -> None:
    args, status = start(__doc__, _arguments, logging.WARNING)
    module("config").load_kube_config(config_file=args.kubeconfig)
    lock = CountingLeaseLock(args.lease_name, args.lease_namespace, args.name, status)
    leader = Leader(args, status)
    status.update(ready=True, leading=False, api_requests=0)
    timings = {  # client-go's names for them
        "lease_duration": args.lease_seconds,
        "renew_deadline": args.renew_deadline_seconds,
        "retry_period": args.retry_seconds,
    }
    election = electionconfig.Config(
        lock, onstarted_leading=leader.started, onstopped_leading=leader.stopped, **timings
    )
    while True:
        # run() campaigns until it leads, renews until it cannot, then returns: campaign again.
        leaderelection.LeaderElection(election).run()


if __name__ == "__main__":
    main()
