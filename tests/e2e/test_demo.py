"""`make demo` cannot rot: run it and check its verdict line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_demo_fires_everything_and_reports(postgres: object) -> None:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    result = subprocess.run(
        [sys.executable, "-m", "hack.demo"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    verdict = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(verdict) == {"expected", "fired", "lost", "duplicates", "handover_ms"}
    assert verdict["lost"] == 0 and verdict["duplicates"] == 0
    assert verdict["fired"] == verdict["expected"] >= 30
    assert len(verdict["handover_ms"]) == 2
    assert "SIGKILL" in result.stdout and "SIGTERM" in result.stdout
