"""Checks shared by the e2e tests, the demo and the chaos run."""

from __future__ import annotations

import collections
import itertools

from schedlock.core.identities import Scheduler, scheduler_of


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


def assert_one_leader_at_a_time(entries: list[dict[str, object]]) -> None:
    """Per key (scheduler; the entries are of one target): each term has one holder, and in
    arrival order the key's terms never go back.  Two leaders at once would deliver under two
    terms interleaved, or two holders under one term."""
    for scheduler in Scheduler:
        mine = sorted(
            (e for e in entries if scheduler_of(str(e["uid"])) is scheduler),
            key=lambda e: float(str(e["arrival"])),
        )
        holders: dict[int, set[str]] = collections.defaultdict(set)
        for entry in mine:
            holders[int(str(entry["term"]))].add(str(entry["holder"]))
        shared = {term: names for term, names in holders.items() if len(names) > 1}
        assert not shared, f"{scheduler}: terms with more than one holder: {shared}"
        for before, after in itertools.pairwise(mine):
            assert int(str(after["term"])) >= int(str(before["term"])), (
                f"{scheduler}: a delivery of term {after['term']} ({after['holder']}) arrived "
                f"after one of term {before['term']} ({before['holder']})"
            )
