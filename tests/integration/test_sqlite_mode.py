"""SQLite mode: one process, always leader, the same loops fire the same rows."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from schedlock.core.identities import Scheduler, scheduler_of
from testbed.sidecars import ReceiverProcess, SidecarProcess, wait_for

SCHEDLOCK = str(Path(sys.executable).parent / "schedlock")


def cli(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SCHEDLOCK, *args],
        env={"SCHEDLOCK_DATABASE_URL": url, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[ReceiverProcess]:
    rx = ReceiverProcess(tmp_path / "rx").start()
    yield rx
    rx.stop()


def test_sqlite_sidecar_fires_one_shot_and_recurring(
    tmp_path: Path, receiver: ReceiverProcess
) -> None:
    url = f"sqlite:///{tmp_path / 'dev.db'}"
    assert cli("migrate", url=url).returncode == 0
    sidecar = SidecarProcess.for_app("solo", tmp_path, url, receiver.url).start()
    try:
        sidecar.wait_ready()
        uids = []
        for i in range(3):
            out = cli(
                "publish",
                "--target",
                "demo",
                "--at",
                f"+{0.2 + i * 0.2:.1f}s",
                "--payload",
                json.dumps({"n": i, "quote": "it's"}),
                url=url,
            )
            assert out.returncode == 0, out.stderr
            uids.append(json.loads(out.stdout)["uid"])
        assert cli("schedule", "--target", "demo", "--cron", "@every 1s", url=url).returncode == 0
        wait_for(
            lambda: {e["uid"] for e in receiver.entries()} >= set(uids),
            timeout=15,
            what="the one-shot rows",
        )
        wait_for(
            lambda: (
                sum(scheduler_of(str(e["uid"])) is Scheduler.RECURRING for e in receiver.entries())
                >= 2
            ),
            timeout=15,
            what="two recurring slots",
        )
        entries = receiver.entries()
        assert {e["holder"] for e in entries} == {
            "solo"
        }  # the replica; the term holder is the sentinel
        assert sorted(e["payload"]["n"] for e in entries if e["uid"] in uids) == [0, 1, 2]
        status = cli("status", "--json", url=url)
        rows = json.loads(status.stdout)
        assert {(r["scheduler"], r["leader"]) for r in rows} == {
            ("publish", "sqlite-leader"),
            ("recurring", "sqlite-leader"),
        }
        assert sidecar.leads("publish") and sidecar.leads("recurring")
    finally:
        sidecar.stop()
    assert sidecar.process is not None and sidecar.process.returncode == 0


def test_migrate_with_grants_on_sqlite_says_nothing_was_granted(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'dev.db'}"
    result = cli("migrate", "--grant-sidecar", "app", url=url)
    assert result.returncode == 0, result.stderr
    assert "granted runtime privileges" not in result.stdout
    assert result.stderr.strip() == "nothing granted: this database has no roles"
    assert "applied migrations" in result.stdout
