"""Host commands of the node: one PATH, a deadline on each, failures as ``ClusterError``."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence

from testbed.node.errors import ClusterError
from testbed.node.plan import PATH

COMMAND_TIMEOUT = 60.0


def run(
    args: Sequence[str],
    *,
    input: str | None = None,
    check: bool = True,
    timeout: float = COMMAND_TIMEOUT,
) -> subprocess.CompletedProcess[str]:
    """Run a host command with the node's PATH and a deadline; raise ``ClusterError`` with its
    output when CHECK and it fails."""
    result = subprocess.run(
        list(args),
        input=input,
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
        env={**os.environ, "PATH": PATH},
    )
    if check and result.returncode != 0:
        raise ClusterError(
            f"`{' '.join(args)}` failed ({result.returncode}):\n{result.stderr}{result.stdout}"
        )
    return result


def which(tool: str) -> str | None:
    return shutil.which(tool, path=PATH)
