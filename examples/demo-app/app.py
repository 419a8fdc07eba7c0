"""A tiny app that takes schedlock's deliveries: the app of the cluster tests and `make dev-up`.

    POST /schedlock   one delivery (JSON body: uid, name, namespace, scheduledAt, attempt, term,
                      payload…; headers Idempotency-Key, optional X-Schedlock-Signature)
                      -> 200 and one JSON line on stdout: {"event": "delivered", …}
    GET  /healthz     200 while running, 503 once draining

Environment:
    PORT            port to listen on (default 8080; 0 picks a free one, see the "listening" line)
    HOST            address to bind (default 0.0.0.0: a Service reaches the pod, the sidecar
                    calls 127.0.0.1)
    POD_NAME        copied into every record (a pod sets it from the Downward API)
    RECORD_URL      when set, every delivery record is POSTed there as JSON before the delivery
                    is answered; when that fails the delivery gets 503, so schedlock retries it
                    and a test's recorder never misses an accepted delivery
    RECORD_TIMEOUT  seconds for that POST (default 2, well inside the sidecar's request timeout)
    DRAIN_SECONDS   on SIGTERM, answer 503 (deliveries and /healthz) this long, then exit 0
                    (default 0): what a real app does while its endpoints are removed

Standard library only, so the image is the base Python plus this file.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import Any
from urllib.parse import urlsplit

HOOK_PATH = "/schedlock"
HEALTH_PATH = "/healthz"
MAX_BODY = 1024 * 1024
# The delivery's fields a record keeps (schedlock.sidecar.delivery.body_for), when present.
FIELDS = ("id", "uid", "namespace", "name", "target", "scheduledAt", "attempt", "term", "holder")
REQUIRED = ("uid", "scheduledAt")


class BadDelivery(ValueError):
    """A request that is not a schedlock delivery: answered 400, which schedlock never retries."""


class Settings:
    """The environment, read and checked once at start-up."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.host = env.get("HOST", "0.0.0.0")
        self.port = int(env.get("PORT", "8080"))
        self.pod = env.get("POD_NAME", "")
        self.record_url = env.get("RECORD_URL", "") or None
        self.record_timeout = float(env.get("RECORD_TIMEOUT", "2"))
        self.drain_seconds = float(env.get("DRAIN_SECONDS", "0"))
        if not 0 <= self.port <= 65535:
            raise ValueError(f"PORT must be 0..65535, not {self.port}")
        scheme = urlsplit(self.record_url).scheme if self.record_url else "http"
        if scheme not in ("http", "https"):
            raise ValueError(f"RECORD_URL must be an http(s) URL, not {self.record_url!r}")
        if self.record_timeout <= 0 or self.drain_seconds < 0:
            raise ValueError("RECORD_TIMEOUT must be > 0 and DRAIN_SECONDS >= 0")


def rfc3339_ms(moment: datetime) -> str:
    """UTC, millisecond precision, a Z suffix: 2026-12-01T10:41:05.123Z."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def delivery_record(
    body: bytes,
    *,
    idempotency_key: str | None,
    signature: str | None,
    pod: str,
    received: datetime,
) -> dict[str, Any]:
    """The record of one delivery (logged, and forwarded to RECORD_URL); BadDelivery if invalid."""
    try:
        delivery = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadDelivery(f"body is not JSON: {exc}") from None
    if not isinstance(delivery, dict):
        raise BadDelivery("body is not a JSON object")
    missing = [field for field in REQUIRED if field not in delivery]
    if not idempotency_key:
        missing.append("Idempotency-Key header")
    if missing:
        raise BadDelivery(f"missing {', '.join(missing)}")
    record: dict[str, Any] = {"event": "delivered", "pod": pod, "receivedAt": rfc3339_ms(received)}
    record["idempotencyKey"] = idempotency_key
    record.update((field, delivery[field]) for field in FIELDS if field in delivery)
    record["signature"] = signature
    record["payload"] = delivery.get("payload")
    return record


def emit(line: dict[str, Any]) -> None:
    """One JSON line on stdout, flushed at once: the tests read the log as it is written."""
    sys.stdout.write(json.dumps(line, separators=(",", ":")) + "\n")
    sys.stdout.flush()


class App:
    """What the handler threads share: the settings, the draining flag, the record forwarder."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.draining = threading.Event()
        # No proxy from the environment: the recorder is reached directly (a Service or loopback).
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def forward(self, record: dict[str, Any]) -> str | None:
        """POST the record to RECORD_URL; the reason it failed, or None."""
        if self.settings.record_url is None:
            return None
        request = urllib.request.Request(  # noqa: S310 - Settings allows only http(s) URLs
            self.settings.record_url,
            data=json.dumps(record, separators=(",", ":")).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with self._opener.open(request, timeout=self.settings.record_timeout) as response:
                response.read()
        except urllib.error.HTTPError as exc:
            return f"recorder answered {exc.code}"
        except (OSError, ValueError) as exc:  # URLError, timeouts, resets are all OSErrors
            return f"recorder unreachable: {exc}"
        return None


class Handler(BaseHTTPRequestHandler):
    # HTTP/1.0: one request per connection, so no idle keep-alive connection holds a handler
    # thread that the exit (which waits for every handler) would then wait on.
    protocol_version = "HTTP/1.0"
    server: Server

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path != HEALTH_PATH:
            self._answer(404, {"error": f"no such path: {self.path}"})
        elif self.server.app.draining.is_set():
            self._answer(503, {"status": "draining"})
        else:
            self._answer(200, {"status": "ok"})

    def do_POST(self) -> None:
        app = self.server.app
        received = datetime.now(UTC)
        if self.path != HOOK_PATH:
            self._answer(404, {"error": f"no such path: {self.path}"})
            return
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self._answer(413, {"error": f"body over {MAX_BODY} bytes"})
            return
        body = self.rfile.read(length)
        if app.draining.is_set():
            self._answer(503, {"error": "draining"})
            return
        try:
            record = delivery_record(
                body,
                idempotency_key=self.headers.get("Idempotency-Key"),
                signature=self.headers.get("X-Schedlock-Signature"),
                pod=app.settings.pod,
                received=received,
            )
        except BadDelivery as exc:
            self._answer(400, {"error": str(exc)})
            return
        failure = app.forward(record)
        if failure is not None:
            emit({**record, "event": "record_failed", "error": failure})
            self._answer(503, {"error": failure})
            return
        emit(record)
        self._answer(200, {"status": "delivered"})

    def log_message(self, format: str, *args: Any) -> None:
        """No access log on stderr: stdout's JSON lines are this app's log."""


class Server(ThreadingHTTPServer):
    # Exiting waits for the requests in flight (a delivery being recorded is finished).
    daemon_threads = False
    block_on_close = True

    def __init__(self, app: App) -> None:
        self.app = app
        super().__init__((app.settings.host, app.settings.port), Handler)


def main(env: Mapping[str, str] = os.environ) -> int:
    settings = Settings(env)
    app = App(settings)
    server = Server(app)
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1})
    thread.start()
    emit({"event": "listening", "pod": settings.pod, "port": server.server_address[1]})
    stop.wait()
    app.draining.set()
    emit({"event": "draining", "pod": settings.pod, "seconds": settings.drain_seconds})
    time.sleep(settings.drain_seconds)
    server.shutdown()
    thread.join()
    server.server_close()
    emit({"event": "stopped", "pod": settings.pod})
    return 0


if __name__ == "__main__":
    sys.exit(main())
