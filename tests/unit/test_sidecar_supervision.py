"""The sidecar's app check runs under a supervisor (issue 21): a check that dies of an error it
does not handle is restarted with back-off, and ``/readyz`` names it while it is down; it ends
with the sidecar's run, also when that ends on an error with no stop signal."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from schedlock.core.settings import EXIT_FAILED, CommandError
from schedlock.sidecar import process
from schedlock.sidecar.process import Sidecar
from schedlock.sidecar.settings import SidecarSettings
from schedlock.sidecar.target import TargetWatch
from schedlock.store import Store, UnsafeConnection


def settings_for(tmp_path: Path) -> SidecarSettings:
    return SidecarSettings(
        database_url=f"sqlite:///{tmp_path / 'dev.db'}",
        target="demo",
        http_host="127.0.0.1",
        http_port=0,
        target_url="http://127.0.0.1:9/hook",  # nothing listens: the app stays unreachable
    )


async def test_a_dead_app_check_is_restarted_and_readyz_says_so_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = 0
    real_run = TargetWatch.run

    async def crashing_once(self: TargetWatch, stopping: asyncio.Event) -> None:
        nonlocal runs
        runs += 1
        if runs == 1:
            while not sidecar.schema_ok:  # dies once /readyz would say anything else
                await asyncio.sleep(0.01)
            raise RuntimeError("a bug in the check loop")
        await real_run(self, stopping)

    monkeypatch.setattr(TargetWatch, "run", crashing_once)
    sidecar = Sidecar(settings_for(tmp_path))
    running = asyncio.create_task(sidecar.run(), name="sidecar")
    said: list[str] = []
    try:
        for _ in range(200):  # the first back-off is 1 s (0.5-1.5 with jitter)
            said.append(sidecar.readiness()[1])
            if runs >= 2 and sidecar.checks is not None and sidecar.checks.health() is None:
                break
            await asyncio.sleep(0.02)
    finally:
        sidecar.stopping.set()
        assert await asyncio.wait_for(running, 30) == 0
    down = [text for text in said if text.startswith("background task down")]
    assert down, said[-5:]
    assert down[0].startswith(
        "background task down: task target-check failed (RuntimeError), restart 1 in "
    ), down[0]
    assert runs == 2, "restarted once, then kept running"
    assert not running.cancelled()


async def test_a_fatal_error_ends_the_run_and_its_app_check_without_a_stop_signal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def unsafe(store: Store, **_: object) -> bool:
        await asyncio.sleep(0.05)  # the app check is running by now
        raise UnsafeConnection("a pooler in transaction mode")

    monkeypatch.setattr(process, "wait_for_schema", unsafe)
    sidecar = Sidecar(settings_for(tmp_path))
    with pytest.raises(CommandError, match="pooler") as raised:
        await asyncio.wait_for(sidecar.run(), 5)
    assert raised.value.code == EXIT_FAILED
    assert not sidecar.stopping.is_set(), "ended by the error, not by a stop"
