"""pytest fixtures for the pinned command-line tools; a missing tool fails, it never skips."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.tools import ToolMissing, tool


def _require(name: str) -> Path:
    try:
        return tool(name)
    except ToolMissing as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="session")
def helm_bin() -> Path:
    return _require("helm")


@pytest.fixture(scope="session")
def promtool_bin() -> Path:
    return _require("promtool")


@pytest.fixture(scope="session")
def prometheus_bin() -> Path:
    return _require("prometheus")
