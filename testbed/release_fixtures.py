"""pytest fixture for an installed earlier release (testbed.releases): built once per machine."""

from __future__ import annotations

import pytest

from testbed.releases import (
    OLDEST_SUPPORTED,
    PER_KEY_SESSIONS,
    Release,
    ReleaseUnavailable,
    install,
)


@pytest.fixture(scope="session")
def oldest_release() -> Release:
    """The oldest supported release, installed in the cache (the first build takes a minute);
    skipped, with what to run, when its commit is not in this clone (a shallow clone)."""
    return _installed(OLDEST_SUPPORTED)


@pytest.fixture(scope="session")
def per_key_release() -> Release:
    """The last release that held a session per key (testbed.releases.PER_KEY_SESSIONS)."""
    return _installed(PER_KEY_SESSIONS)


def _installed(release: Release) -> Release:
    try:
        return install(release)
    except ReleaseUnavailable as exc:
        pytest.skip(str(exc))
