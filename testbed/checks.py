"""Checks shared by the e2e tests, the demo and the chaos run."""

from __future__ import annotations

import collections


def assert_duplicates_only_across_crash(
    entries: list[dict[str, object]], crashed: set[str]
) -> None:
    """A uid may arrive twice only when a crashed holder's delivery was re-fired, same key."""
    by_uid: dict[str, list[dict[str, object]]] = collections.defaultdict(list)
    for entry in entries:
        by_uid[str(entry["uid"])].append(entry)
    for uid, got in by_uid.items():
        if len(got) == 1:
            continue
        keys = {e["key"] for e in got}
        assert len(keys) == 1, f"{uid} delivered under different idempotency keys: {keys}"
        first, *rest = sorted(got, key=lambda e: float(str(e["arrival"])))
        assert first["holder"] in crashed, f"{uid} delivered twice without a crash: {got}"
        assert all(int(str(e["term"])) > int(str(first["term"])) for e in rest), got
