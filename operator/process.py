"""The ``schedlock operator`` process: kopf handlers + the status sync, one supervised unit.

HA choice: run ONE replica (Deployment with ``strategy: Recreate``) in kopf's standalone mode.
Handlers are idempotent (upserts keyed by uid + generation), so an overlap during a rollout is
harmless; the status sync is guarded by an advisory lock, so at most one replica posts Events.
kopf peering would add a cluster-wide CRD and RBAC for little gain at this size.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Iterator

import kopf

from schedlock.core.aio import Supervisor, now, restart_backoff
from schedlock.core.httpio import CannotServe, serve
from schedlock.core.logs import Event
from schedlock.core.probes import health_routes
from schedlock.core.settings import EXIT_BAD_SETTING, CommandError
from schedlock.operator.handlers import LIST_PAGE, ObjectIndex, build_registry, configure, list_into
from schedlock.operator.kube import Kube
from schedlock.operator.reassert import Reasserter
from schedlock.operator.settings import OperatorSettings
from schedlock.operator.sync import StatusSync
from schedlock.store import (
    EVERY_NAMESPACE,
    NamespaceNotServed,
    ReadOnlyServer,
    Store,
    StoreError,
    open_store,
    wait_for_schema,
)
from schedlock.store.retention import Pruner, RetentionPolicy

log = logging.getLogger("schedlock.operator")
ADMIN_POOL_SIZE = 4  # database sessions for the handlers' upserts (a burst queues in the pool)
STOP_SECONDS = 5.0  # how long the status sync and the re-assertion get to stop on their own


class Readiness:
    """What ``/readyz`` says: not ready (and why) until the schema is usable and kopf runs."""

    def __init__(self) -> None:
        self.reason = "starting"
        self.kopf_ready = asyncio.Event()
        self.schema_ok = False
        self.read_only: str | None = None  # the last re-assertion found a read-only server
        self.tasks: Supervisor | None = None  # the background tasks, once they run

    # What is wrong in words: anyone who reaches the pod reads /readyz, and kubelet copies it
    # into Events; the detail, which may quote the database, is in the log.
    def report_schema(self, error: StoreError | None) -> None:
        self.schema_ok = error is None
        self.reason = error.summary if error is not None else "ok"

    def report_writes(self, error: StoreError | None) -> None:
        self.read_only = error.summary if isinstance(error, ReadOnlyServer) else None

    def __call__(self) -> tuple[bool, str]:
        if not self.schema_ok:
            return False, f"database not ready: {self.reason}"
        if self.read_only is not None:
            return False, f"database not writable: {self.read_only}"
        if not self.kopf_ready.is_set():
            return False, "starting the Kubernetes watches"
        down = self.tasks.health() if self.tasks is not None else None
        if down is not None:
            return False, f"background task down: {down}"
        return True, "ready"


@contextlib.contextmanager
def signals_stop(stopping: asyncio.Event) -> Iterator[None]:
    """SIGTERM/SIGINT end the wait for the database (kopf installs its own handlers later)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    try:
        yield
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


async def run(settings: OperatorSettings) -> int:
    store = open_store(
        settings.database_url,
        application_name=settings.holder_name,
        pool_size=ADMIN_POOL_SIZE,
        schema=settings.database_schema,
    )
    readiness = Readiness()
    stopping = asyncio.Event()
    try:
        server = await serve(health_routes(readiness), "0.0.0.0", settings.health_port)
    except CannotServe as exc:
        raise CommandError(f"{exc} (/healthz, /readyz)") from exc
    try:
        with signals_stop(stopping):
            # Database down, not migrated, newer than this binary, missing privileges: stay up
            # and not ready with the reason, start kopf once it is usable (no crash loop).
            # A role that may not serve what it watches would have every write refused by
            # row-level security (migration 0008): a configuration error, exit 2.
            try:
                usable = await wait_for_schema(
                    store,
                    migrate=settings.migrate == "auto",
                    component="operator",
                    namespaces=settings.watch_namespaces or (EVERY_NAMESPACE,),
                    stopping=stopping,
                    report=readiness.report_schema,
                    log=log,
                    fatal=(NamespaceNotServed,),
                )
            except NamespaceNotServed as exc:  # no retry fixes it: exit 2 before kopf runs
                log.error(
                    "may not serve what it watches, exiting",
                    extra={"event": Event.OPERATOR_FATAL, "error": str(exc)},
                )
                raise CommandError(str(exc), EXIT_BAD_SETTING) from exc
            if not usable:
                log.info(
                    "operator stopped before the database was ready",
                    extra={"event": Event.OPERATOR_STOPPED, "database_ready": False},
                )
                return 0
        return await run_kopf(store, settings, readiness, stopping)
    finally:
        await server.close()
        await store.close()


async def run_kopf(
    store: Store,
    settings: OperatorSettings,
    readiness: Readiness,
    stopping: asyncio.Event,
) -> int:
    kopf_settings = kopf.OperatorSettings()
    configure(kopf_settings)
    if settings.webhook_enabled:
        kopf_settings.admission.server = kopf.WebhookServer(
            addr=settings.webhook_host,
            port=settings.webhook_port,
            certfile=str(settings.webhook_cert_file),
            pkeyfile=str(settings.webhook_key_file),
        )
    objects = ObjectIndex()
    registry = build_registry(
        store,
        validate=settings.webhook_enabled,
        injection=settings.injection if settings.webhook_enabled else None,
        objects=objects,
    )
    reasserter = Reasserter(
        store,
        objects.objects,
        interval=settings.reassert_seconds,
        wanted=objects.wanted,
        report=readiness.report_writes,
    )
    watched = frozenset(settings.watch_namespaces)
    kube = Kube()  # loads the client configuration at its first call, not here
    sync = StatusSync(
        store,
        kube,
        sweep_seconds=settings.sweep_seconds,
        holder=settings.holder_name,
        catch_up_seconds=settings.sync_catch_up_seconds,
        known=objects.get,  # the status in the API, from the watch: no GET per outcome
        listed=objects.complete,
        covers=lambda namespace: not watched or namespace in watched,
        lost=reasserter.wake,  # a row that lost its outcome: restore it now
    )

    async def list_objects() -> None:
        """The listing that completes the index; then the sync and the re-assertion start."""
        started = now()
        count = await list_into(
            objects,
            lambda namespace, token: kube.list_page(namespace, token, LIST_PAGE),
            settings.watch_namespaces,
        )
        log.info(
            "listed the objects",
            extra={
                "event": Event.OBJECTS_LISTED,
                "objects": count,
                "seconds": round(now() - started, 3),
            },
        )
        reasserter.wake()

    # The operator contends for the pruning lease like the sidecars, on one of its pool's
    # sessions for a pass (schedlock.store.retention); it exports no metrics, the sidecars do.
    pruner = Pruner(store, f"{settings.holder_name}-operator", RetentionPolicy.of(settings))
    log.info(
        "operator started",
        extra={
            "event": Event.OPERATOR_STARTED,
            "holder": settings.holder_name,
            "namespaces": list(settings.watch_namespaces) or "all",
            "webhook": settings.webhook_enabled,
        },
    )
    try:
        # The background tasks are restarted after a failure (logged, with back-off) and
        # /readyz fails while one is down; kopf runs its watches in the group's body, and its
        # end stops the rest in stages (each gets STOP_SECONDS to finish, then is cancelled).
        async with Supervisor(
            "operator",
            stopping=stopping,
            stop_timeout=STOP_SECONDS,
            expected=(kopf.LoginError,),  # said in one line below, no traceback
            logger=log,
        ) as tasks:
            readiness.tasks = tasks
            tasks.supervise("list-objects", list_objects, restart_backoff())
            tasks.supervise("status-sync", lambda: sync.run(stopping), restart_backoff())
            tasks.supervise("reassert", lambda: reasserter.run(stopping), restart_backoff())
            tasks.supervise("prune", lambda: pruner.run(stopping), restart_backoff())
            try:
                await kopf.operator(
                    registry=registry,
                    settings=kopf_settings,
                    # Named, not detected: kopf's detection calls getpass.getuser(), which
                    # raises in an image whose uid (65532) has no passwd entry — its own pod.
                    # kopf types it as its Identity, a NewType of str it does not export (at
                    # run time the str itself): the name is passed as it is.
                    identity=settings.holder_name,  # type: ignore[arg-type]
                    standalone=True,
                    clusterwide=not settings.watch_namespaces,
                    namespaces=settings.watch_namespaces,
                    ready_flag=readiness.kopf_ready,
                )
            finally:
                stopping.set()
    except kopf.LoginError as exc:
        raise CommandError(f"cannot log in to Kubernetes: {exc}") from exc
    finally:
        log.info(
            "operator stopped", extra={"event": Event.OPERATOR_STOPPED, "database_ready": True}
        )
    return 0
