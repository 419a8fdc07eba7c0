"""The maintained systems a user would install instead, run unmodified beside schedlock.

``river/`` is a Go module (built by ``hack/tools.sh ensure river-bench``) that runs River's own
migrations and a River client; ``procrastinate_worker`` runs a procrastinate worker.  Both fire
the same ``schedlock_publishes`` rows to the same recording app: ``jobs`` turns every row the
scenarios write into one job of the peer, through the peer's own insert path.
"""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

RIVER_MODULE = Path(__file__).resolve().parent / "river"


def versions() -> dict[str, str | None]:
    """The peers' pinned versions, as the results record them."""
    gomod = (RIVER_MODULE / "go.mod").read_text()

    def required(module: str) -> str | None:
        found = re.search(rf"^\s*(?:require\s+)?{re.escape(module)} (v\S+)", gomod, re.M)
        return found.group(1) if found else None

    return {
        "river": required("github.com/riverqueue/river"),
        "riverpgxv5": required("github.com/riverqueue/river/riverdriver/riverpgxv5"),
        "pgx": required("github.com/jackc/pgx/v5"),
        "procrastinate": metadata.version("procrastinate"),
    }
