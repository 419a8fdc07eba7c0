"""Real sidecar processes and a real receiving app, for tests, the demo and benchmarks."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socketserver
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from schedlock.core.metrics import Registry
from schedlock.store import LockKey
from testbed.deliveries import complete_records
from testbed.leaders import leader
from testbed.pg import free_port
from testbed.procs import NamedProcess, die_with_parent, terminate

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[1]


def _bin(name: str) -> str:
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


class Deadline:
    """One wait for a predicate, ``timeout`` seconds long: ``poll`` raises TimeoutError, naming
    what was awaited, where the predicate is still false once the time has passed."""

    def __init__(self, timeout: float, what: str) -> None:
        self.timeout, self.what = timeout, what
        self.at = time.monotonic() + timeout

    def poll(self, predicate: Callable[[], T | None]) -> T | None:
        """PREDICATE's value; TimeoutError instead of a falsy one past the deadline."""
        value = predicate()
        if not value and time.monotonic() > self.at:
            raise TimeoutError(f"timed out after {self.timeout:g}s waiting for {self.what}")
        return value


def wait_for(
    predicate: Callable[[], Any],
    timeout: float = 10,
    interval: float = 0.02,
    what: str = "condition",
) -> Any:
    deadline = Deadline(timeout, what)
    while not (value := deadline.poll(predicate)):
        time.sleep(interval)
    return value


def http_get(url: str, timeout: float = 2) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()
    except (urllib.error.URLError, OSError) as exc:
        return 0, str(exc)


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {'name{labels}': value} (labels as printed)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            with contextlib.suppress(ValueError):
                values[name] = float(value)
    return values


def sample_value(
    registry: Registry, name: str, labels: Mapping[str, str] | None = None
) -> float | None:
    """One sample of an in-process sidecar's metrics (None when there is no such series)."""
    wanted = dict(labels or {})
    found = (v for sample, got, v in registry.samples() if sample == name and got == wanted)
    return next(found, None)


_stand_in_app: socketserver.ThreadingTCPServer | None = None


def stand_in_app_url() -> str:
    """A target URL whose port accepts every connection and closes it: an app that is there.

    For sidecars in tests that fire nothing but must lead (leadership follows the app: a
    sidecar whose app does not answer never competes). One per test process, never stopped.
    """
    global _stand_in_app
    if _stand_in_app is None:
        _stand_in_app = socketserver.ThreadingTCPServer(
            ("127.0.0.1", 0), socketserver.BaseRequestHandler
        )
        _stand_in_app.daemon_threads = True
        threading.Thread(target=_stand_in_app.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{_stand_in_app.server_address[1]}/schedlock"


@dataclass
class ReceiverProcess:
    """``testbed.receiver`` in its own process, logging every delivery it gets."""

    workdir: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.workdir / "deliveries.jsonl"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/schedlock"

    def start(self) -> ReceiverProcess:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_path.touch()
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "testbed.receiver",
                "--port",
                str(self.port),
                "--log",
                str(self.log_path),
            ],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=(self.workdir / "receiver.err").open("ab"),
            preexec_fn=die_with_parent(),
        )
        wait_for(
            lambda: http_get(f"http://127.0.0.1:{self.port}/healthz")[0] == 200,
            timeout=15,
            what="the receiver to listen",
        )
        return self

    def entries(self) -> list[dict[str, Any]]:
        """Every delivery so far (a line still being written is left out)."""
        return complete_records(self.log_path.read_bytes())[0]

    def control(self, **settings: Any) -> None:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/control",
            data=json.dumps(settings).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            response.read()

    def stop(self) -> None:
        terminate(self.process, 5)
        self.process = None

    def kill(self) -> None:
        """SIGKILL: the app vanishes at once, its port refuses connections from then on."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(5)
        self.process = None


@dataclass
class SidecarProcess(NamedProcess):
    """One ``schedlock sidecar`` process with its own metrics port and log file."""

    name: str
    workdir: Path
    env: dict[str, str]
    http_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    program: str = ""  # the schedlock to run: this checkout's unless an older release's

    @classmethod
    def for_app(
        cls, name: str, workdir: Path, url: str, app_url: str, **env: str
    ) -> SidecarProcess:
        """A sidecar of target ``demo`` on the database ``url`` whose app answers at ``app_url``."""
        return cls(
            name,
            workdir,
            {
                "SCHEDLOCK_DATABASE_URL": url,
                "SCHEDLOCK_TARGET": "demo",
                "SCHEDLOCK_TARGET_URL": app_url,
                **env,
            },
        )

    @classmethod
    def for_stand_in_app(cls, name: str, workdir: Path, url: str, **env: str) -> SidecarProcess:
        """A sidecar of target ``demo`` whose app is there and takes nothing (it just leads)."""
        return cls.for_app(name, workdir, url, stand_in_app_url(), **env)

    def start(self) -> SidecarProcess:
        self.workdir.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "SCHEDLOCK_HOLDER": self.name,
            "SCHEDLOCK_HTTP_PORT": str(self.http_port),
            "SCHEDLOCK_HTTP_HOST": "127.0.0.1",
            **self.env,
        }
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [self.program or _bin("schedlock"), "sidecar"],
            env=env,
            stdout=log,
            stderr=log,
            cwd=self.workdir,
            preexec_fn=die_with_parent(),
        )
        log.close()
        return self

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.http_port}{path}"

    def ready(self) -> bool:
        return http_get(self.url("/readyz"))[0] == 200

    def wait_ready(self, timeout: float = 60) -> SidecarProcess:
        wait_for(self.ready, timeout=timeout, what=f"{self.name} to be ready")
        return self

    def metrics(self) -> dict[str, float]:
        status, text = http_get(self.url("/metrics"))
        return parse_metrics(text) if status == 200 else {}

    def leads(self, scheduler: str = "publish") -> bool:
        return any(
            k.startswith("schedlock_leader{") and f'scheduler="{scheduler}"' in k and v == 1
            for k, v in self.metrics().items()
        )

    def role(self, scheduler: str = "publish") -> str | None:
        """Its role for ``scheduler``'s key as its metrics say (``leader``, ``standby``,
        ``reserve``), or None (between roles, or not answering)."""
        held = [
            sample.split('role="', 1)[1].split('"', 1)[0]
            for sample, value in self.metrics().items()
            if sample.startswith("schedlock_role{")
            and f'scheduler="{scheduler}"' in sample
            and value == 1
        ]
        return held[0] if held else None

    def signal(self, sig: signal.Signals) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def wait(self, timeout: float = 15) -> int:
        assert self.process is not None
        return self.process.wait(timeout)

    def stop(self) -> None:
        terminate(self.process, 10, resume=True)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@dataclass
class SidecarGroup:
    """Several replicas of one app (same namespace and target) plus its receiver."""

    workdir: Path
    database_url: str
    target: str = "demo"
    namespace: str = "default"
    replicas: int = 3
    extra_env: dict[str, str] = field(default_factory=dict)
    receiver: ReceiverProcess | None = None
    sidecars: list[SidecarProcess] = field(default_factory=list)

    def start(self, wait_ready: bool = True) -> SidecarGroup:
        if self.receiver is None:
            self.receiver = ReceiverProcess(self.workdir / "receiver").start()
        for _ in range(self.replicas):
            self.add()
        if wait_ready:
            for sidecar in self.sidecars:
                sidecar.wait_ready()
        return self

    def add(self, name: str = "", program: str = "") -> SidecarProcess:
        """One more replica, ``target-<n>`` unless named, running this checkout's ``schedlock``
        unless ``program`` is another (an older release's, in the upgrade test)."""
        assert self.receiver is not None
        env = {
            "SCHEDLOCK_DATABASE_URL": self.database_url,
            "SCHEDLOCK_NAMESPACE": self.namespace,
            "SCHEDLOCK_TARGET": self.target,
            "SCHEDLOCK_TARGET_URL": self.receiver.url,
            **self.extra_env,
        }
        name = name or f"{self.target}-{len(self.sidecars)}"
        sidecar = SidecarProcess(name, self.workdir, env, program=program).start()
        self.sidecars.append(sidecar)
        return sidecar

    def leaders(self, scheduler: str = "publish") -> list[SidecarProcess]:
        """The live replicas leading ``scheduler``'s key, as the database says (testbed.leaders)."""
        name = leader(self.database_url, LockKey(scheduler, self.namespace, self.target))
        return [s for s in self.sidecars if s.alive() and s.name == name]

    def wait_leader(self, scheduler: str = "publish", timeout: float = 20) -> SidecarProcess:
        # 10 Hz: key_status() reads pg_locks; polled much faster it slows the hand-over it
        # waits for (chaos.local has the measurement).
        leaders: list[SidecarProcess] = wait_for(
            lambda: self.leaders(scheduler), timeout, 0.1, f"a {scheduler} leader"
        )
        assert len(leaders) == 1, [s.name for s in leaders]
        return leaders[0]

    def stop(self) -> None:
        for sidecar in self.sidecars:
            sidecar.stop()
        if self.receiver is not None:
            self.receiver.stop()

    def __iter__(self) -> Iterator[SidecarProcess]:
        return iter(self.sidecars)


def schedlock_cli(
    *args: str, url: str, timeout: float = 60, **env: str
) -> subprocess.CompletedProcess[str]:
    """This checkout's ``schedlock`` command against ``url``, with ``env`` and no other
    SCHEDLOCK_ setting of the test run's environment."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDLOCK_")}
    return subprocess.run(
        [str(Path(sys.executable).parent / "schedlock"), *args],
        env={**base, **env, "SCHEDLOCK_DATABASE_URL": url},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
