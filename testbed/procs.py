"""Process helpers shared by the test bed: spawning, stopping, and reading ``/proc``.

A process found in ``/proc`` is named by pid and start time (``Proc``), so a recycled pid is
never signalled, and ``find`` never returns this process or one of its ancestors."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
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


# --------------------------------------------------------------------------- /proc


@dataclass(frozen=True)
class Stat:
    """The fields of ``/proc/<pid>/stat`` the test bed reads."""

    state: str
    """One letter: R, S, D, T, Z (zombie), X (dead)…"""
    ppid: int
    start: int
    """Start time in clock ticks since boot: with the pid, it names one process for good."""
    cpu_ticks: int
    """User + system CPU time so far, in clock ticks (``SC_CLK_TCK`` a second)."""

    @property
    def exited(self) -> bool:
        """A zombie or dead: it has exited, whether or not its parent has reaped it yet."""
        return self.state in ("Z", "X")


def stat(pid: int) -> Stat | None:
    """PID's ``/proc/<pid>/stat``; None when there is no such process."""
    try:
        return parse_stat(Path(f"/proc/{pid}/stat").read_text())
    except (OSError, ValueError):
        return None


def parse_stat(text: str) -> Stat:
    """A ``/proc/<pid>/stat`` line; fields count from the last ``)``, as the command in
    parentheses may hold spaces and parentheses itself."""
    fields = text[text.rindex(")") + 2 :].split()
    return Stat(
        state=fields[0],
        ppid=int(fields[1]),
        start=int(fields[19]),
        cpu_ticks=int(fields[11]) + int(fields[12]),  # utime, stime (fields 14 and 15)
    )


def status_kb(pid: int) -> dict[str, int]:
    """The ``kB`` fields of PID's ``/proc/<pid>/status`` (``VmRSS``, ``VmHWM``, ``RssAnon``…)
    by name; empty when there is no such process (it ended between a listing and the read)."""
    try:
        return parse_status_kb(Path(f"/proc/{pid}/status").read_text())
    except OSError:
        return {}


def parse_status_kb(text: str) -> dict[str, int]:
    """The ``kB`` fields of a ``/proc/<pid>/status`` text by name."""
    fields: dict[str, int] = {}
    for line in text.splitlines():
        name, sep, rest = line.partition(":")
        parts = rest.split()
        if sep and len(parts) == 2 and parts[1] == "kB" and parts[0].isdigit():
            fields[name] = int(parts[0])
    return fields


def children(parent: int) -> list[int]:
    """The live processes whose parent is ``parent``."""
    return [
        int(entry.name)
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit() and (found := stat(int(entry.name))) and found.ppid == parent
    ]


def start_time(pid: int) -> int | None:
    """Start time of a live PID; None when it is gone or a zombie (a killed run's process may
    wait for a parent that never reaps it)."""
    found = stat(pid)
    return None if found is None or found.exited else found.start


def argv(pid: int) -> list[str]:
    """PID's command line (as it set it: PostgreSQL writes titles there); [] if unreadable."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0")[:-1]]


@dataclass(frozen=True)
class Proc:
    """A process by pid and start time, so a recycled pid is never mistaken for it."""

    name: str
    pid: int
    start: int

    @classmethod
    def of(cls, name: str, pid: int) -> Proc | None:
        """The live process PID, or None when it is gone or a zombie."""
        start = start_time(pid)
        return None if start is None else cls(name, pid, start)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Proc:
        return cls(str(data["name"]), int(data["pid"]), int(data["start"]))

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "pid": self.pid, "start": self.start}

    def alive(self) -> bool:
        return start_time(self.pid) == self.start


def ancestors() -> set[int]:
    """This process and its ancestors up to (not including) init: never swept."""
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        found = stat(pid)
        if found is None:
            break
        pid = found.ppid
    return pids


def find(match: Callable[[int, list[str]], bool]) -> list[Proc]:
    """Live processes, other than this one and its ancestors, for which ``match(pid, argv)``
    holds (an OSError in MATCH, a process gone meanwhile, counts as no match)."""
    spare = ancestors()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in spare:
            continue
        pid = int(entry.name)
        args = argv(pid)
        with contextlib.suppress(OSError):
            if args and match(pid, args):
                proc = Proc.of(Path(args[0]).name, pid)
                if proc is not None:
                    found.append(proc)
    return found


def descendants(procs: Iterable[Proc]) -> list[Proc]:
    """Live descendants of PROCS (a child that setsid() escapes a group kill, not this)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            found = stat(int(entry.name))
            if found is not None:
                children.setdefault(found.ppid, []).append(int(entry.name))
    result: list[Proc] = []
    pending = [proc.pid for proc in procs]
    while pending:
        for pid in children.get(pending.pop(), []):
            proc = Proc.of((argv(pid) or ["?"])[0], pid)
            if proc is not None:
                result.append(proc)
                pending.append(pid)
    return result


def signal_group(pid: int, sig: signal.Signals) -> None:
    """Signal PID's process group when PID leads one, else PID alone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


def wait_gone(procs: Iterable[Proc], timeout: float) -> bool:
    """Wait until none of PROCS is alive, reaping those that are this process's children;
    False if some still were after TIMEOUT seconds."""
    deadline = time.monotonic() + timeout
    pending = list(procs)
    while True:
        for proc in [proc for proc in pending if not proc.alive()]:
            pending.remove(proc)
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(proc.pid, os.WNOHANG)
        if not pending:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def sweep(procs: Iterable[Proc], timeout: float, *, groups: bool = False) -> None:
    """SIGKILL each of PROCS still alive (its process group too when GROUPS and it leads
    one) and wait up to TIMEOUT seconds until all are gone."""
    victims = list(procs)
    for proc in victims:
        if proc.alive():
            if groups:
                signal_group(proc.pid, signal.SIGKILL)
            else:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
    wait_gone(victims, timeout)
