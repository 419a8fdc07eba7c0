"""The default readiness check (a TCP connection, no request) against real plain-Python apps:
whatever the app does with a connection that brings no request, it must not log an error.

Each app runs in its own process and logs to stderr as such apps do (asyncio prints an
unhandled error of a connection's callback with its traceback; http.server and aiohttp print
theirs).  The check runs as often as a sidecar's would in half a minute, and the app's
stderr must hold no error line.  The asyncio app answers a missing request with a 400, written
in two steps as an app writes headers and body: a check that closed its end at once made the
second write meet the kernel's reset (``ConnectionResetError``), every time.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from schedlock.sidecar.metrics import SidecarMetrics
from schedlock.sidecar.target import TargetWatch, Thresholds, derive_check
from testbed.pg import free_port

pytestmark = pytest.mark.integration

CHECKS = 30

ASYNCIO_APP = """
import asyncio, sys

async def handle(reader, writer):
    head = await reader.read(65536)  # the request, or b'' when the client sent none
    if not head.endswith(b"\\r\\n\\r\\n"):  # a missing or partial request: 400
        writer.write(b"HTTP/1.1 400 Bad Request\\r\\nContent-Length: 11\\r\\nConnection: close\\r\\n\\r\\n")
        await writer.drain()
        await asyncio.sleep(0.005)
        writer.write(b"bad request")
        await writer.drain()
    writer.close()
    await writer.wait_closed()

async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", int(sys.argv[1]))
    print("listening", flush=True)
    async with server:
        await server.serve_forever()

asyncio.run(main())
"""

HTTP_SERVER_APP = """
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        self.send_response(200)
        self.end_headers()

server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
print("listening", flush=True)
server.serve_forever()
"""

AIOHTTP_APP = """
import logging, sys
from aiohttp import web

logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)
app = web.Application()
app.router.add_post("/schedlock", lambda request: web.Response(text="ok"))
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=lambda *_: print("listening", flush=True))
"""

ERROR_WORDS = ("Error", "Traceback", "Exception", "ERROR")


@contextmanager
def app_process(source: str) -> Iterator[tuple[int, list[str]]]:
    """Run ``source`` as an app on a free port; yields the port and, once it ended, its stderr."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", source, str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stderr: list[str] = []
    try:
        assert proc.stdout is not None
        assert "listening" in proc.stdout.readline()
        yield port, stderr
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
        stderr.extend(err.splitlines())


def error_lines(lines: list[str]) -> list[str]:
    return [line for line in lines if any(word in line for word in ERROR_WORDS)]


@pytest.mark.parametrize(
    "source", [ASYNCIO_APP, HTTP_SERVER_APP, AIOHTTP_APP], ids=["asyncio", "http.server", "aiohttp"]
)
async def test_default_check_leaves_no_error_in_the_apps_log(source: str) -> None:
    with app_process(source) as (port, stderr):
        check = derive_check(f"http://127.0.0.1:{port}/schedlock", "")
        assert check.kind == "tcp"
        watch = TargetWatch(
            check,
            interval=1.0,
            timeout=1.0,
            thresholds=Thresholds(failures=2, successes=2),
            metrics=SidecarMetrics(),
        )
        async with watch:
            # As the watch's loop checks, without its sleeps: every check found the app.
            results = [await watch._probe() for _ in range(CHECKS)]
        assert results == [None] * CHECKS
        time.sleep(0.2)  # the app's last connection ends on its side too
    assert error_lines(stderr) == [], "\n".join(stderr[:20])
