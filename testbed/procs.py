"""Process helpers shared by the test bed."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

PR_SET_PDEATHSIG = 1


def die_with_parent() -> Callable[[], None] | None:
    """A preexec_fn that makes the child get SIGKILL when the spawning process dies.

    atexit does not run when pytest is SIGKILLed or crashes; PR_SET_PDEATHSIG does. Caveat:
    "parent" is the thread that spawned the child, so spawn from a thread that outlives it
    (the main thread, a pytest fixture).
    """
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)

    def hook() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)

    return hook


def terminate(
    process: subprocess.Popen[bytes] | None, grace: float = 10, *, resume: bool = False
) -> None:
    """SIGTERM a running child, SIGKILL it after ``grace`` seconds, and reap it.

    ``resume`` sends SIGCONT first: a stopped process (SIGSTOP in a test) cannot handle
    SIGTERM until it runs again.
    """
    if process is None or process.poll() is not None:
        return
    if resume:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGCONT)
    process.terminate()
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def output(
    args: list[str], what: str, *, error: type[Exception] = RuntimeError, **options: Any
) -> str:
    """Run ``args`` (``subprocess.run`` ``options``) and return its stdout, stripped; raise
    ``error`` naming ``what``, the exit status and the stderr when it fails."""
    result = subprocess.run(args, capture_output=True, text=True, check=False, **options)
    if result.returncode != 0:
        raise error(f"{what} failed ({result.returncode}): {result.stderr.strip()}")
    return str(result.stdout).strip()


class StartStop:
    """``start()`` on entering a ``with`` block, ``stop()`` on leaving it, however it is left."""

    def start(self) -> object:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class NamedProcess:
    """A child process called ``name`` that logs to ``workdir/<name>.log``."""

    name: str
    workdir: Path
    process: subprocess.Popen[bytes] | None

    @property
    def log_path(self) -> Path:
        return self.workdir / f"{self.name}.log"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid
