"""The sidecar's HTTP endpoints: /metrics (Prometheus), /healthz (alive), /readyz (ready)."""

from __future__ import annotations

from schedlock.core.httpio import Reply, Route
from schedlock.core.metrics import CONTENT_TYPE, Registry
from schedlock.core.probes import Readiness, health_routes


def endpoints(registry: Registry, readiness: Readiness) -> dict[str, Route]:
    def metrics() -> Reply:
        return Reply(200, registry.exposition(), CONTENT_TYPE)

    return {**health_routes(readiness), "/metrics": metrics}
