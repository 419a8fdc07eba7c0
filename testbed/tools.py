"""Where the pinned tool binaries live (``hack/tools.sh`` builds or installs them)."""

from __future__ import annotations

import shutil
import subprocess
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


class ToolMissing(RuntimeError):
    pass


@cache
def tool(name: str) -> Path:
    """Absolute path of a pinned tool; raises ToolMissing with the command that installs it."""
    bindir = subprocess.run(
        ["bash", str(REPO / "hack" / "tools.sh"), "bindir", name],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    path = Path(bindir) / name
    if not path.exists():
        found = shutil.which(name)
        if found is None:
            raise ToolMissing(
                f"{name} is not installed: run `make tools` (hack/tools.sh ensure {name})"
            )
        return Path(found)
    return path
