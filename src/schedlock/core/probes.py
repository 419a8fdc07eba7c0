"""Health endpoints every long-running schedlock process serves: /healthz and /readyz.

``/healthz`` answers while the event loop runs (liveness); ``/readyz`` answers 200 or 503 with
the reason in one line, e.g. ``database not ready: role 'app' lacks INSERT on …``, so
``kubectl describe pod`` shows why a pod is not ready.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from aiohttp import web

Readiness = Callable[[], tuple[bool, str]]


class CannotServe(Exception):
    """The HTTP port cannot be bound (in use, not permitted): one line, the process exits 1."""


def health_app(readiness: Readiness) -> web.Application:
    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        ready, reason = readiness()
        return web.Response(text=f"{reason}\n", status=200 if ready else 503)

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


async def serve(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Start serving; returns the runner (for cleanup) and the bound port (port 0 picks one)."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        why = os.strerror(exc.errno).lower() if exc.errno else str(exc)  # asyncio's is long
        raise CannotServe(f"cannot serve HTTP on {host}:{port}: {why}") from exc
    bound = port
    for address in runner.addresses:  # the real port when 0 was asked for
        if isinstance(address, tuple) and len(address) >= 2:
            bound = int(address[1])
            break
    return runner, bound
