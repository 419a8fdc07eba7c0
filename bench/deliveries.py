"""The receiver's append-only log of deliveries, read incrementally while a run goes on."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from schedlock.core.identities import parse_rfc3339


@dataclass(frozen=True, slots=True)
class Delivery:
    uid: str
    holder: str
    arrival: float  # receiver's time.time() when the request arrived
    scheduled_at: float | None  # the row's due time (epoch seconds), from the request body


def _epoch(text: object) -> float | None:
    if not isinstance(text, str) or not text:
        return None
    return parse_rfc3339(text).timestamp()


class DeliveryLog:
    """Tails ``deliveries.jsonl``: ``refresh()`` parses only what was appended since last time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: list[Delivery] = []
        self._offset = 0
        self._partial = b""

    def refresh(self) -> list[Delivery]:
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return self.entries
        self._offset += len(chunk)
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            if not line.strip():
                continue
            raw = json.loads(line)
            self.entries.append(
                Delivery(
                    uid=str(raw.get("uid")),
                    holder=str(raw.get("holder")),
                    arrival=float(raw["arrival"]),
                    scheduled_at=_epoch(raw.get("scheduledAt")),
                )
            )
        return self.entries

    def first_arrivals(self) -> dict[str, Delivery]:
        """uid -> its first delivery (a re-fire after a crash arrives later)."""
        first: dict[str, Delivery] = {}
        for entry in self.refresh():
            seen = first.get(entry.uid)
            if seen is None or entry.arrival < seen.arrival:
                first[entry.uid] = entry
        return first
