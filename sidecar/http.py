"""The sidecar's HTTP endpoints: /metrics (Prometheus), /healthz (alive), /readyz (ready)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from schedlock.core.httpio import Reply, Route
from schedlock.core.probes import Readiness, health_routes


def endpoints(registry: CollectorRegistry, readiness: Readiness) -> dict[str, Route]:
    def metrics() -> Reply:
        return Reply(200, generate_latest(registry), CONTENT_TYPE_LATEST)

    return {**health_routes(readiness), "/metrics": metrics}
