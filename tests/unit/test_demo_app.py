"""The demo app (examples/demo-app/app.py): records, forwarding, draining.

Pure parts are called directly; the HTTP behaviour runs the app's server in this process on
an ephemeral loopback port, and one test runs the file with this Python to check the SIGTERM
drain and exit code a pod relies on.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from testbed.deliveries import Delivery

APP = Path(__file__).resolve().parents[2] / "examples" / "demo-app" / "app.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("demo_app", APP)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


demo = _load()

DELIVERY = {
    "id": 7,
    "uid": "0b0e6f4e-uid",
    "namespace": "shop",
    "name": "launch",
    "target": "web",
    "scheduledAt": "2026-12-01T10:00:00Z",
    "attempt": 1,
    "term": 3,
    "holder": "web-0",
    "payload": {"sku": 42},
}


# --------------------------------------------------------------------------- pure parts


def test_rfc3339_ms_is_utc_with_milliseconds() -> None:
    moment = datetime(2026, 12, 1, 11, 41, 5, 123456, tzinfo=timezone(timedelta(hours=1)))
    assert demo.rfc3339_ms(moment) == "2026-12-01T10:41:05.123Z"


def test_settings_defaults_and_refusals() -> None:
    settings = demo.Settings({})
    assert (settings.host, settings.port, settings.record_url) == ("0.0.0.0", 8080, None)
    assert (settings.record_timeout, settings.drain_seconds) == (2.0, 0.0)
    for env in ({"PORT": "70000"}, {"RECORD_URL": "file:///etc/passwd"}, {"DRAIN_SECONDS": "-1"}):
        with pytest.raises(ValueError, match=r"PORT|RECORD_URL|DRAIN_SECONDS"):
            demo.Settings(env)


def test_delivery_record_keeps_what_the_tests_match_on() -> None:
    received = datetime(2026, 12, 1, 10, 0, 0, 250000, tzinfo=UTC)
    record = demo.delivery_record(
        json.dumps(DELIVERY).encode(),
        idempotency_key="key-1",
        signature="t=1,v1=ab",
        pod="web-0",
        received=received,
    )
    assert record == {
        "event": "delivered",
        "pod": "web-0",
        "receivedAt": "2026-12-01T10:00:00.250Z",
        "idempotencyKey": "key-1",
        "signature": "t=1,v1=ab",
        **DELIVERY,
    }


@pytest.mark.parametrize(
    ("body", "key", "message"),
    [
        (b"not json", "k", "not JSON"),
        (b"[1, 2]", "k", "not a JSON object"),
        (json.dumps({"scheduledAt": "x"}).encode(), "k", "missing uid"),
        (json.dumps(DELIVERY).encode(), None, "missing Idempotency-Key header"),
    ],
)
def test_delivery_record_refuses_what_is_not_a_delivery(
    body: bytes, key: str | None, message: str
) -> None:
    with pytest.raises(demo.BadDelivery, match=message):
        demo.delivery_record(
            body, idempotency_key=key, signature=None, pod="", received=datetime.now(UTC)
        )


# --------------------------------------------------------------------------- HTTP, in process


class Recorder:
    """What the cluster tests run on the host: collects forwarded records."""

    def __init__(self, status: int = 204) -> None:
        self.records: list[dict[str, Any]] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers["Content-Length"])
                recorder.records.append(json.loads(self.rfile.read(length)))
                self.send_response(status)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                del format, args

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/records"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextlib.contextmanager
def serving(env: dict[str, str]) -> Iterator[tuple[Any, str]]:
    app = demo.App(demo.Settings({"HOST": "127.0.0.1", "PORT": "0", **env}))
    server = demo.Server(app)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield app, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        thread.join()
        server.server_close()


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    recorder = Recorder()
    yield recorder
    recorder.close()


def _request(url: str, body: dict[str, Any] | None = None, **headers: str) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _log(capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_a_delivery_is_recorded_logged_and_answered_200(
    recorder: Recorder, capsys: pytest.CaptureFixture[str]
) -> None:
    with serving({"POD_NAME": "web-1", "RECORD_URL": recorder.url}) as (_app, url):
        status, answer = _request(
            f"{url}/schedlock",
            DELIVERY,
            **{"Idempotency-Key": "key-9", "X-Schedlock-Signature": "t=1,v1=ff"},
        )
        assert (status, answer) == (200, {"status": "delivered"})
        assert _request(f"{url}/healthz") == (200, {"status": "ok"})
    (record,) = recorder.records
    assert record["event"] == "delivered"
    assert (record["uid"], record["idempotencyKey"], record["pod"]) == (
        DELIVERY["uid"],
        "key-9",
        "web-1",
    )
    assert record["signature"] == "t=1,v1=ff"
    assert _log(capsys) == [record]


def test_a_recorder_failure_answers_503_so_schedlock_retries(
    capsys: pytest.CaptureFixture[str],
) -> None:
    refusing = Recorder(status=500)
    try:
        for url_env in (refusing.url, "http://127.0.0.1:9/closed"):
            with serving({"RECORD_URL": url_env, "RECORD_TIMEOUT": "1"}) as (_app, url):
                status, _ = _request(f"{url}/schedlock", DELIVERY, **{"Idempotency-Key": "k"})
                assert status == 503
    finally:
        refusing.close()
    events = [line["event"] for line in _log(capsys)]
    assert events == ["record_failed", "record_failed"]


def test_bad_requests_and_draining(capsys: pytest.CaptureFixture[str]) -> None:
    with serving({}) as (app, url):
        assert _request(f"{url}/schedlock", {"uid": "u"}, **{"Idempotency-Key": "k"})[0] == 400
        assert _request(f"{url}/elsewhere", DELIVERY)[0] == 404
        app.draining.set()
        assert _request(f"{url}/healthz") == (503, {"status": "draining"})
        assert _request(f"{url}/schedlock", DELIVERY, **{"Idempotency-Key": "k"})[0] == 503
    assert _log(capsys) == []


# --------------------------------------------------------------------------- the process


def test_sigterm_drains_for_drain_seconds_then_exits_0() -> None:
    process = subprocess.Popen(
        [sys.executable, str(APP)],
        env={"PORT": "0", "HOST": "127.0.0.1", "POD_NAME": "web-2", "DRAIN_SECONDS": "1"},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        listening = json.loads(process.stdout.readline())
        assert listening["event"] == "listening"
        url = f"http://127.0.0.1:{listening['port']}"
        assert _request(f"{url}/schedlock", DELIVERY, **{"Idempotency-Key": "k"})[0] == 200
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert json.loads(process.stdout.readline())["event"] == "delivered"
        assert json.loads(process.stdout.readline())["event"] == "draining"
        assert _request(f"{url}/healthz")[0] == 503
        assert process.wait(timeout=10) == 0
        assert time.monotonic() - started >= 1
        assert json.loads(process.stdout.readline()) == {"event": "stopped", "pod": "web-2"}
    finally:
        process.kill()
        process.wait()


def test_its_record_reads_as_the_same_delivery_as_the_host_receivers_line() -> None:
    received = datetime(2026, 12, 1, 10, 0, 0, 250000, tzinfo=UTC)
    record = demo.delivery_record(
        json.dumps(DELIVERY).encode(), idempotency_key="k", signature=None, pod="web-0-pod",
        received=received,
    )  # fmt: skip
    line = {**DELIVERY, "key": "k", "arrival": received.timestamp(), "status": 200}
    assert Delivery.from_demo_app(record) == Delivery.from_receiver(line)
    assert Delivery.from_demo_app(record).pod == "web-0-pod"
    assert Delivery.from_demo_app(record).late_seconds == 0.25
