"""The sizing rule of docs/operations.md ("Database sessions") and what `schedlock status` says
of the budget: the table's figures follow the rule with the defaults the code has."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from schedlock.cli.admin import budget_line
from schedlock.operator.process import ADMIN_POOL_SIZE
from schedlock.sidecar.settings import SidecarSettings
from schedlock.store import SessionBudget

DOCS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
# The operator's sessions: its pool, its LISTEN and the status sync's lock.
OPERATOR_POOL = ADMIN_POOL_SIZE + 2


def rule(targets: int, standbys: int) -> int:
    return targets * (1 + standbys) + OPERATOR_POOL


def sizing_rows() -> list[tuple[int, int, int]]:
    section = DOCS.read_text().split("### Database sessions: the sizing rule", 1)[1]
    section = section.split("\n### ", 1)[0].split("\n## ", 1)[0]
    rows = re.findall(r"^\| ([\d,]+) \| ([\d,]+) \| ([\d,]+) \|", section, re.MULTILINE)
    return [tuple(int(cell.replace(",", "")) for cell in row) for row in rows]  # type: ignore[misc]


def test_the_documented_table_follows_the_rule_with_the_code_s_defaults() -> None:
    (default,) = (f.default for f in dataclasses.fields(SidecarSettings) if f.name == "standbys")
    assert default == 1, "sessions per target <= 2 with every default"
    rows = sizing_rows()
    assert [targets for targets, _, _ in rows] == [100, 500, 1000]
    for targets, with_default, with_none in rows:
        assert with_default == rule(targets, default), targets
        assert with_none == rule(targets, 0), targets
    assert "operator pool" in DOCS.read_text() and f"{OPERATOR_POOL} in all" in DOCS.read_text()


def test_status_says_the_budget_by_role_against_the_limit() -> None:
    said = budget_line(
        SessionBudget(leaders=3, standbys=2, sessions=5, client_sessions=47, max_connections=150)
    )
    assert said is not None
    assert said.startswith(
        "database sessions: 5 held by schedlock sidecars (3 leading, 2 standing by; "
        "reserves hold none), 47 client sessions in all, max_connections 150"
    )
    assert budget_line(SessionBudget(0, 0, 0, 0, None)) is None  # SQLite: no server sessions
