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
import sys

import kopf
from schedlock.operator.handlers import build_registry, configure
from schedlock.operator.settings import OperatorSettings
from schedlock.operator.sync import StatusSync
from schedlock.store import SchemaNotCurrent, StoreError, StoreUnavailable, ensure_schema
from schedlock.store.postgres import PostgresStore

log = logging.getLogger("schedlock.operator")
EXIT_FATAL = 1


async def wait_for_schema(store: PostgresStore, settings: OperatorSettings) -> None:
    delay = 0.5
    while True:
        try:
            await ensure_schema(store, migrate=settings.migrate == "auto")
            return
        except (StoreUnavailable, SchemaNotCurrent) as exc:
            log.warning(
                "database not ready, retrying", extra={"error": str(exc), "retry_in_s": delay}
            )
        await asyncio.sleep(delay)
        delay = min(delay * 2, 10.0)


async def run(settings: OperatorSettings) -> int:
    store = PostgresStore(settings.database_url, application_name=settings.holder_name)
    try:
        await wait_for_schema(store, settings)
    except StoreError as exc:
        print(f"schedlock operator: error: {exc}", file=sys.stderr)
        return EXIT_FATAL
    kopf_settings = kopf.OperatorSettings()
    configure(kopf_settings)
    if settings.webhook_enabled:
        kopf_settings.admission.server = kopf.WebhookServer(
            addr=settings.webhook_host,
            port=settings.webhook_port,
            certfile=str(settings.webhook_cert_file),
            pkeyfile=str(settings.webhook_key_file),
        )
    registry = build_registry(
        store,
        validate=settings.webhook_enabled,
        injection=settings.injection if settings.webhook_enabled else None,
    )
    stopping = asyncio.Event()
    sync = StatusSync(
        store, None, sweep_seconds=settings.sweep_seconds, holder=settings.holder_name
    )
    sync_task = asyncio.create_task(sync.run(stopping), name="status-sync")
    log.info(
        "operator started",
        extra={
            "holder": settings.holder_name,
            "namespaces": list(settings.watch_namespaces) or "all",
            "webhook": settings.webhook_enabled,
        },
    )
    try:
        await kopf.operator(
            registry=registry,
            settings=kopf_settings,
            standalone=True,
            clusterwide=not settings.watch_namespaces,
            namespaces=settings.watch_namespaces,
            liveness_endpoint=f"http://0.0.0.0:{settings.health_port}/healthz",
        )
    except kopf.LoginError as exc:
        print(f"schedlock operator: error: cannot log in to Kubernetes: {exc}", file=sys.stderr)
        return EXIT_FATAL
    finally:
        stopping.set()
        try:
            await asyncio.wait_for(sync_task, 5)
        except TimeoutError:
            sync_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sync_task
        log.info("operator stopped")
    return 0
