"""Health endpoints every long-running schedlock process serves: /healthz and /readyz.

``/healthz`` answers while the event loop runs (liveness); ``/readyz`` answers 200 or 503 with
the reason in one line, e.g. ``database not ready: role 'app' lacks INSERT on …``, so
``kubectl describe pod`` shows why a pod is not ready.
"""

from __future__ import annotations

from collections.abc import Callable

from schedlock.core.httpio import Reply, Route, text

Readiness = Callable[[], tuple[bool, str]]


def health_routes(readiness: Readiness) -> dict[str, Route]:
    def readyz() -> Reply:
        ready, reason = readiness()
        return text(200 if ready else 503, reason)

    return {"/healthz": lambda: text(200, "ok"), "/readyz": readyz}
