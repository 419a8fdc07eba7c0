"""The delivery records of the recording apps, read as one type (``testbed.deliveries``)."""

from __future__ import annotations

import json
from pathlib import Path

from testbed.deliveries import Delivery, DeliveryLog
from testbed.sidecars import ReceiverProcess

LINE = {
    "uid": "u1", "key": "u1/2026-12-01T10:00:00Z", "term": 3, "attempt": 2, "holder": "web-0",
    "target": "web", "scheduledAt": "2026-12-01T10:00:00Z", "arrival": 1796119200.25,
    "status": 503,
}  # fmt: skip


def test_a_receiver_line_is_typed() -> None:
    got = Delivery.from_receiver(LINE)
    assert got == Delivery(
        "u1", "u1/2026-12-01T10:00:00Z", 3, 2, "web-0", 1796119200.25, 503, "web"
    )
    assert got.scheduled == 1796119200.0 and got.late_seconds == 0.25 and not got.ok


def test_the_log_is_tailed_a_whole_line_at_a_time(tmp_path: Path) -> None:
    path = tmp_path / "deliveries.jsonl"
    log = DeliveryLog(path)
    assert log.refresh() == []  # not written yet
    text = json.dumps(LINE) + "\n" + json.dumps({**LINE, "uid": "u2", "arrival": 1796119199.0})
    path.write_text(text[:-5])  # the second line still being written
    assert [d.uid for d in log.refresh()] == ["u1"]
    path.write_text(text + "\n" + json.dumps({**LINE, "arrival": 1796119201.0}) + "\n")
    assert [d.uid for d in log.refresh()] == ["u1", "u2", "u1"]
    first = log.first_arrivals()
    assert first["u1"].arrival == 1796119200.25 and first["u2"].arrival == 1796119199.0


def test_a_receivers_entries_leave_out_a_line_cut_by_a_racing_read(tmp_path: Path) -> None:
    """A read racing the receiver's append can end inside a line (CI saw one end after
    ``, ``); the whole lines are the entries, the cut one waits for the next read."""
    receiver = ReceiverProcess(tmp_path)
    text = json.dumps(LINE) + "\n" + json.dumps({**LINE, "uid": "u2"}) + "\n"
    for cut in (len(text) - 1, text.index("u2") + 10, len(json.dumps(LINE)) + 1):
        receiver.log_path.write_text(text[:cut])
        assert [e["uid"] for e in receiver.entries()] == ["u1"], cut
    receiver.log_path.write_text(text)
    assert [e["uid"] for e in receiver.entries()] == ["u1", "u2"]
