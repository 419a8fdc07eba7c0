"""pytest fixture for an installed earlier release (testbed.releases): built once per machine."""

from __future__ import annotations

import pytest

from testbed.releases import OLDEST_SUPPORTED, Release, ReleaseUnavailable, install


@pytest.fixture(scope="session")
def oldest_release() -> Release:
    """The oldest supported release, installed in the cache (the first build takes a minute);
    skipped, with what to run, when its commit is not in this clone (a shallow clone)."""
    try:
        return install(OLDEST_SUPPORTED)
    except ReleaseUnavailable as exc:
        pytest.skip(str(exc))
