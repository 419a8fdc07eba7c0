"""Where the pinned tool binaries live (``hack/tools.sh`` builds or installs them)."""

from __future__ import annotations

import shutil
import subprocess
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


class ToolMissing(RuntimeError):
    pass


def tool_dir(name: str) -> Path:
    """Ask hack/tools.sh where NAME lives (its bindir), so the pinned versions apply."""
    result = subprocess.run(
        ["bash", str(REPO / "hack" / "tools.sh"), "bindir", name],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0 or not result.stdout.strip():
        raise ToolMissing(
            f"hack/tools.sh bindir {name} failed ({result.returncode}): {result.stderr.strip()}"
        )
    return Path(result.stdout.strip())


@cache
def tool(name: str) -> Path:
    """Absolute path of a pinned tool; raises ToolMissing with the command that installs it."""
    path = tool_dir(name) / name
    if not path.exists():
        found = shutil.which(name)
        if found is None:
            raise ToolMissing(
                f"{name} is not installed: run `make tools` (hack/tools.sh ensure {name})"
            )
        return Path(found)
    return path
