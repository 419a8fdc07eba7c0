"""Process helpers shared by the test bed."""

from __future__ import annotations

import ctypes
import signal
import sys
from collections.abc import Callable

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
