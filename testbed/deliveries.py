"""A delivery as an app received it: one type for every recording app, and the log reader.

Two apps record deliveries: ``testbed.receiver`` on the host (one JSON line per delivery in
``deliveries.jsonl``) and the in-cluster demo app (``examples/demo-app/app.py``, which
forwards each record to ``testbed.incluster.Recorder``).  Their records differ in field names
only; the chaos checker, the demo, the bench and the tests read both as :class:`Delivery`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schedlock.core.identities import parse_rfc3339


def _epoch(text: object) -> float | None:
    return parse_rfc3339(str(text)).timestamp() if text else None


@dataclass(frozen=True, slots=True)
class Delivery:
    uid: str
    key: str  # the Idempotency-Key header
    term: int
    attempt: int
    holder: str
    arrival: float  # epoch seconds on the app's clock, when the request arrived
    status: int = 200  # what the app answered
    target: str = ""
    scheduled: float | None = field(default=None, compare=False)  # due time, database clock
    pod: str = field(default="", compare=False)  # the in-cluster app's pod

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def late_seconds(self) -> float:
        assert self.scheduled is not None, f"{self.uid}: no scheduled time recorded"
        return self.arrival - self.scheduled

    @classmethod
    def from_receiver(cls, line: Mapping[str, Any]) -> Delivery:
        """One line of ``testbed.receiver``'s ``deliveries.jsonl``."""
        return cls(
            uid=str(line["uid"]),
            key=str(line.get("key")),
            term=int(line.get("term") or 0),
            attempt=int(line.get("attempt") or 0),
            holder=str(line.get("holder")),
            arrival=float(line["arrival"]),
            status=int(line["status"]),
            target=str(line.get("target")),
            scheduled=_epoch(line.get("scheduledAt")),
        )

    @classmethod
    def from_demo_app(cls, record: Mapping[str, Any]) -> Delivery:
        """One record of the in-cluster demo app (``delivery_record`` in its ``app.py``)."""
        return cls(
            uid=str(record["uid"]),
            key=str(record["idempotencyKey"]),
            term=int(record.get("term") or 0),
            attempt=int(record.get("attempt") or 0),
            holder=str(record.get("holder") or ""),
            arrival=parse_rfc3339(str(record["receivedAt"])).timestamp(),
            target=str(record.get("target") or ""),
            scheduled=_epoch(record["scheduledAt"]),
            pod=str(record.get("pod") or ""),
        )

    def as_check_entry(self) -> dict[str, object]:
        """The shape testbed.checks.assert_duplicates_only_across_crash reads."""
        return {
            "uid": self.uid,
            "key": self.key,
            "term": self.term,
            "holder": self.holder,
            "arrival": self.arrival,
        }


def complete_records(data: bytes) -> tuple[list[dict[str, Any]], bytes]:
    """The JSON lines of DATA that are whole, and the tail of a line still being written.

    A reader racing the receiver's append can see a line cut anywhere (a regular file's read
    is not atomic against a write); that tail is left for the next read, never parsed."""
    *lines, partial = data.split(b"\n")
    return [json.loads(line) for line in lines if line.strip()], partial


class DeliveryLog:
    """Tails ``deliveries.jsonl``: ``refresh()`` parses only what was appended since last time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: list[Delivery] = []
        self._offset = 0
        self._partial = b""

    def refresh(self) -> list[Delivery]:
        """Every delivery so far."""
        self.appended()
        return self.entries

    def appended(self) -> list[Delivery]:
        """The deliveries written since the last read."""
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(chunk)
        records, self._partial = complete_records(self._partial + chunk)
        new = [Delivery.from_receiver(record) for record in records]
        self.entries.extend(new)
        return new

    def first_arrivals(self) -> dict[str, Delivery]:
        """uid -> its first delivery (a re-fire after a crash arrives later)."""
        first: dict[str, Delivery] = {}
        for entry in self.refresh():
            seen = first.get(entry.uid)
            if seen is None or entry.arrival < seen.arrival:
                first[entry.uid] = entry
        return first
