"""A watchdog that cleans up after a benchmark run that died without cleaning up itself.

Every process the harness starts dies with it (``PR_SET_PDEATHSIG``), except the PostgreSQL
postmaster, which ``testbed.pg`` starts in its own session so that tests can signal it.
This guard is started with no death signal; it waits until its parent is gone (re-parented),
then ends the postmaster's process group and removes the run's directories.  After a normal
run the harness cleans up first and terminates the guard.

``python -m bench.guard PARENT_PID POSTMASTER_PID DIR [DIR …]``
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
