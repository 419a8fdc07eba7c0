"""The sidecar's HTTP endpoints: /metrics (Prometheus), /healthz (alive), /readyz (ready)."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from schedlock.core.probes import Readiness, health_app


def build_app(registry: CollectorRegistry, readiness: Readiness) -> web.Application:
    async def metrics(_: web.Request) -> web.Response:
        body = generate_latest(registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = health_app(readiness)
    app.router.add_get("/metrics", metrics)
    return app
