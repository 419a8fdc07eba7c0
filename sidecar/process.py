"""The ``schedlock sidecar`` process: settings -> database -> one elector per lock key.

The electors run under one supervisor (``schedlock.core.aio``: every failure logged, the first
ends the process if fatal); SIGTERM/SIGINT start a staged shutdown (stop claiming, finish or
abandon in-flight deliveries within the grace, unlock, exit 0) that is cut off a lease after
the grace at the latest.  A database that is
down at start — or unreachable, refusing the credentials, lacking privileges, or migrated by a
newer schedlock — is retried with backoff while /readyz says why: no crash loop, recovery
without a restart.  Errors that make running unsafe (a transaction-mode pooler, a lock key
collision) end the process with one line on stderr and exit status 1; a role that may not
serve the configured namespace (``schedlock migrate --grant-sidecar ROLE --namespace NS``) ends
it before it takes any lock, with one line naming the role, the namespace and the fix, and
exit status 2 (a configuration error).

The app's readiness check runs from the start, whatever the database does: an elector competes
only while the app is reachable (``schedlock.sidecar.target``), and ``/readyz`` is 503 while it
is not — see docs/architecture.md "Leadership follows the app" for why.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import random
import signal

from schedlock.core.aio import Supervisor, restart_backoff
from schedlock.core.httpio import CannotServe, serve
from schedlock.core.logs import Event
from schedlock.core.redact import Scrubber, printable, redact, secrets_of
from schedlock.core.settings import EXIT_BAD_SETTING, EXIT_FAILED, CommandError, add_command
from schedlock.sidecar.delivery import Deliverer
from schedlock.sidecar.firing import Firer, FiringOptions
from schedlock.sidecar.http import endpoints
from schedlock.sidecar.lock import FATAL, RETRIED, UNSAFE, Elector, Role
from schedlock.sidecar.metrics import SidecarMetrics
from schedlock.sidecar.settings import SidecarSettings
from schedlock.sidecar.target import TargetWatch, Thresholds, derive_check
from schedlock.store import (
    LockKey,
    NamespaceNotServed,
    SchemaNotCurrent,
    Store,
    StoreError,
    StoreUnavailable,
    open_store,
    wait_for_schema,
)
from schedlock.store.retention import Pruner, RetentionPolicy, retention_by_state

log = logging.getLogger("schedlock.sidecar")


class Sidecar:
    def __init__(self, settings: SidecarSettings, metrics: SidecarMetrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics or SidecarMetrics()
        self.store: Store = open_store(
            settings.database_url,
            application_name=settings.holder_name,
            schema=settings.database_schema,
        )
        self.stopping = asyncio.Event()
        self.electors: list[Elector] = []
        self.tasks: Supervisor | None = None  # the electors' group, once it runs
        self.checks: Supervisor | None = None  # the app check's group
        self.schema_ok = False
        self.not_ready_reason = "starting"
        self.http_port: int | None = None
        # The app's check reports quote its URL, which may carry credentials of its own.
        self.target_scrubber = Scrubber(secrets_of(settings.target_url, settings.target_ready_url))
        self.app = TargetWatch(
            derive_check(settings.target_url, settings.target_ready_url),
            interval=settings.target_check_seconds,
            timeout=settings.target_check_timeout,
            thresholds=Thresholds(
                failures=settings.target_failure_threshold,
                successes=settings.target_success_threshold,
            ),
            metrics=self.metrics,
        )

    def readiness(self) -> tuple[bool, str]:
        """``/readyz``: what is wrong in words (anyone who reaches the pod reads it, and kubelet
        copies it into Events); the detail, which may quote the database, is in the log."""
        if not self.schema_ok:
            return False, f"database not ready: {self.not_ready_reason}"
        tasks_down = "; ".join(
            filter(None, (group.health() for group in (self.checks, self.tasks) if group))
        )
        if tasks_down:
            return False, f"background task down: {tasks_down}"
        if not self.app.up:
            return False, (
                f"target unreachable ({redact(self.app.check.url)}): "
                f"{printable(self.target_scrubber(self.app.reason), 300)}; "
                "not competing for leadership, its rows wait"
            )
        down = [e for e in self.electors if not e.settled]
        if down:
            why = "; ".join(f"{e.lock}: {e.last_summary or 'connecting'}" for e in down)
            return False, f"lock sessions not connected: {why}"
        # Ready all the same in both cases below: the pod's readiness gates the app's traffic.
        warnings: list[str] = []
        squatted = [said for e in self.electors if (said := e.squatted)]
        if squatted:
            # Lock squatting: a session of another namespace's role holds the key's lock, so
            # its rows wait.  Said here, never a 503: whoever can hold a lock by hand must not
            # be able to take this app out of service too.  The alert and the runbook say what
            # to do (docs/operations.md).
            warnings.append(
                "key's lock held by a role that may not serve this namespace, its rows wait "
                "(an admin ends that session: pg_terminate_backend): " + "; ".join(squatted)
            )
        refused = [str(e.lock) for e in self.electors if e.refused]
        if refused:
            # A database out of slots is no reason to take the app out of service.  This
            # replica holds no session and backs off; the leader and standbys keep theirs.
            warnings.append(
                "as a reserve backing off (database out of connection slots): " + ", ".join(refused)
            )
        return True, ("ok, " + "; ".join(warnings)) if warnings else "ok"

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        try:
            server = await serve(
                endpoints(self.metrics.registry, self.readiness),
                self.settings.http_host,
                self.settings.http_port,
            )
        except CannotServe as exc:
            raise CommandError(f"{exc} (/metrics, /healthz, /readyz)") from exc
        self.http_port = server.port
        log.info(
            "sidecar started",
            extra={
                "event": Event.SIDECAR_STARTED,
                "holder": self.settings.holder_name,
                "namespace": self.settings.namespace,
                "target": self.settings.target,
                "dialect": self.store.dialect,
                "http_port": self.http_port,
                "lease_seconds": self.settings.lease_seconds,
                "target_check": redact(self.app.check.url),
            },
        )
        # The app check runs from the start (the electors wait on it) under its own group: a
        # check that dies of a bug is restarted with back-off and /readyz says so meanwhile;
        # it serves the block's body (a companion), so it ends with it.  An error that ends the
        # process is raised once everything is closed, not through it.
        ending: CommandError | None = None
        try:
            async with Supervisor("checks", stopping=self.stopping, logger=log) as checks:
                self.checks = checks
                checks.supervise("target-check", self._check_app, restart_backoff(), companion=True)
                try:
                    usable = await wait_for_schema(
                        self.store,
                        migrate=self.settings.migrate == "auto",
                        component="sidecar",
                        namespaces=(self.settings.namespace,),
                        stopping=self.stopping,
                        report=self._report_schema,
                        log=log,
                        fatal=(*UNSAFE, NamespaceNotServed),
                    )
                    if usable:
                        await self._run_electors()
                except NamespaceNotServed as exc:  # a configuration error: exit 2, before any lock
                    ending = _ending("may not serve this namespace, exiting", exc, EXIT_BAD_SETTING)
                except FATAL as exc:
                    ending = _ending("cannot run safely, exiting", exc, EXIT_FAILED)
        finally:
            await server.close()
            await self.store.close()
        if ending is not None:
            raise ending
        return 0

    async def _check_app(self) -> None:
        async with self.app:
            await self.app.run(self.stopping)

    def _on_signal(self, sig: signal.Signals) -> None:
        log.info("shutting down", extra={"event": Event.SHUTDOWN_REQUESTED, "signal": sig.name})
        self.stopping.set()

    def _report_schema(self, error: StoreError | None) -> None:
        if error is None:
            self.schema_ok = True
            self.metrics.database_up.set(1)
            return
        self.not_ready_reason = error.summary
        if isinstance(error, (StoreUnavailable, SchemaNotCurrent)):
            self.metrics.database_up.set(0)

    async def _run_electors(self) -> None:
        s = self.settings
        # Without notifications a new row waits for the poll: keep it short then.
        poll = s.poll_seconds if self.store.notifies else min(s.poll_seconds, 1.0)
        options = FiringOptions(
            batch_size=s.batch_size,
            concurrency=s.concurrency,
            poll_seconds=poll,
            shutdown_grace_seconds=s.shutdown_grace_seconds,
        )
        async with Deliverer(
            s.target_url,
            timeout_seconds=s.request_timeout_seconds,
            concurrency=s.concurrency * len(s.scheduler_names),
            signing_secret=s.signing_secret(),
            holder=s.holder_name,
        ) as deliverer:
            firer = Firer(deliverer, self.metrics, options, app=self.app, rng=random.Random())
            # One elector, one session, for every key of the target (schedlock.sidecar.lock).
            self.electors = [
                Elector(
                    self.store,
                    tuple(
                        LockKey(scheduler, s.namespace, s.target) for scheduler in s.scheduler_names
                    ),
                    holder=s.holder_name,
                    timings=s.timings,
                    metrics=self.metrics,
                    work=firer,
                    app=self.app,
                    standbys=s.standbys,
                    reserve_check_seconds=s.reserve_check_seconds,
                )
            ]
            # A staged stop: each elector ends its term (in-flight deliveries get the grace),
            # then unlocks; one that has not stopped a lease after the grace is cancelled (its
            # session ends with the process, and with it the lock).
            async with Supervisor(
                "electors",
                stopping=self.stopping,
                stop_timeout=s.shutdown_grace_seconds + s.lease_seconds,
                expected=RETRIED,
                logger=log,
            ) as electors:
                # An elector that dies of an error it does not handle (a bug) is restarted
                # with back-off, /readyz failing meanwhile; its session ended with it, so a
                # standby leads.  Errors that make running unsafe still end the process.
                self.tasks = electors
                for elector in self.electors:
                    electors.supervise(
                        f"elector:{elector.lock}",
                        functools.partial(elector.run, self.stopping),
                        restart_backoff(),
                        fatal=FATAL,
                    )
                pruner = self._pruner()
                electors.supervise(
                    "pruner", lambda: pruner.run(self.stopping, self._leads), restart_backoff()
                )
        log.info("sidecar stopped", extra={"event": Event.SIDECAR_STOPPED})

    def _pruner(self) -> Pruner:
        """Every sidecar that leads a key contends for the pruning lease, on a short session of
        its own store (never a lock session): no operator is needed for history to be pruned."""
        policy = RetentionPolicy.of(self.settings)
        if policy.enabled:
            self.metrics.init_history(retention_by_state(policy))
        return Pruner(
            self.store,
            self.settings.holder_name,
            policy,
            report=self.metrics.observe_pass,
            counted=self.metrics.count_pruned,
        )

    def _leads(self) -> bool:
        # Followers and reserves stay out: contenders are bounded by the keys, not the replicas.
        return any(e.role is Role.LEADING for e in self.electors)


def _ending(message: str, exc: Exception, code: int) -> CommandError:
    """Log why the process ends; the error the CLI says in one line, exiting with ``code``."""
    log.error(message, extra={"event": Event.SIDECAR_FATAL, "error": str(exc)})
    return CommandError(str(exc), code)


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    add_command(
        subparsers,
        "sidecar",
        SidecarSettings,
        lambda settings, _args: asyncio.run(Sidecar(settings).run()),
        summary="run the lock-guarded scheduler loops next to an app container",
        description="Compete with the other replicas of this app for the lock of each "
        "scheduler key (publish, recurring) x namespace x target; the leader claims due rows "
        "and POSTs them to the app.",
    )
