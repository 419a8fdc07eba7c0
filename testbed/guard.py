"""A watchdog that cleans up after the process that started a PostgreSQL server died
without stopping it (a pytest killed mid-run, a benchmark harness that crashed).

The postmaster runs in a session of its own (so that tests can signal it) and with no death
signal, so it would outlive its owner.  :class:`testbed.pg.PostgresServer` starts this guard
beside every postmaster, and the bench harness one for its run directory: it waits until its
parent is gone (re-parented), then ends the postmaster's process group and removes the
directories.  A server stopped normally terminates its guard first.  No imports of the
project's: it runs as a plain script.

``python testbed/guard.py PARENT_PID POSTMASTER_PID DIR [DIR …]``
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import time


def main(argv: list[str]) -> int:
    parent, postmaster, *dirs = argv
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the harness, which cleans up
    while os.getppid() == int(parent):
        time.sleep(0.5)
    for sig in (signal.SIGQUIT, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(int(postmaster), sig)
        time.sleep(1)
    for path in dirs:
        shutil.rmtree(path, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
