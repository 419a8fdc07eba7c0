"""What every scenario gets: the test bed, the profile, a place for results, a progress log."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any

from bench.env import BenchEnv
from bench.profiles import Profile


@dataclass
class Context:
    env: BenchEnv
    profile: Profile
    results: dict[str, Any] = field(default_factory=dict)
    # Raw series for the plots (never written to JSON whole): name -> system -> values
    series: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    censored: dict[str, dict[str, list[bool]]] = field(default_factory=dict)  # same shape
    extras: dict[str, Any] = field(default_factory=dict)  # passed between scenarios
    started: float = field(default_factory=time.monotonic)

    def say(self, message: str) -> None:
        elapsed = time.monotonic() - self.started
        print(f"[bench {elapsed:6.1f}s] {message}", file=sys.stderr, flush=True)
