"""What the operator asks of kopf in configure(), beyond what other tests exercise."""

from __future__ import annotations

import sys

import kopf

from schedlock.operator import handlers


def test_the_initial_listing_comes_in_pages() -> None:
    """10,000 objects are 20 LISTs of 500 at a start (bench `operator_10k`, `api_requests`),
    not one response of every object parsed whole."""
    settings = kopf.OperatorSettings()
    assert settings.watching.chunk_size is None  # kopf's default: everything at once
    before = sys.getrecursionlimit()
    try:
        handlers.configure(settings)
    finally:
        sys.setrecursionlimit(before)
    assert settings.watching.chunk_size == handlers.LIST_PAGE
