"""The one reader of /proc/<pid>/stat: fields after the command, whatever the command holds."""

from __future__ import annotations

import os
import subprocess

from testbed.procs import (
    Proc,
    Stat,
    ancestors,
    children,
    parse_stat,
    parse_status_kb,
    start_time,
    stat,
    status_kb,
)

# A PostgreSQL backend retitles itself: the command holds spaces and parentheses.
LINE = (
    "4242 (postgres: soak (x) idle) S 4100 4100 4100 0 -1 4194560 1 0 0 0 7 5 0 0 20 0 1 0 "
    "987654 1000 10 18446744073709551615"
)


def test_fields_count_from_the_last_parenthesis() -> None:
    assert parse_stat(LINE) == Stat(state="S", ppid=4100, start=987654, cpu_ticks=7 + 5)


def test_status_fields_in_kb() -> None:
    text = "Name:\tpostgres\nVmPeak:\t  222028 kB\nVmRSS:\t   23616 kB\nRssAnon:\t    3200 kB\nThreads:\t1\n"
    assert parse_status_kb(text) == {"VmPeak": 222028, "VmRSS": 23616, "RssAnon": 3200}


def test_a_zombie_has_exited() -> None:
    assert parse_stat(LINE.replace(") S ", ") Z ")).exited
    assert not parse_stat(LINE).exited


def test_this_process_reads_as_alive_with_its_parent_and_ancestors() -> None:
    me = stat(os.getpid())
    assert me is not None and me.ppid == os.getppid()
    assert start_time(os.getpid()) == me.start
    proc = Proc.of("me", os.getpid())
    assert proc is not None and proc.alive()
    assert not Proc("me", os.getpid(), me.start + 1).alive()  # a recycled pid is not this one
    assert Proc.from_json(proc.to_json()) == proc
    assert {os.getpid(), os.getppid()} <= ancestors()


def test_a_child_is_found_with_its_status() -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert child.pid in children(os.getpid())
        assert status_kb(child.pid)["VmRSS"] > 0
    finally:
        child.kill()
        child.wait()
    assert child.pid not in children(os.getpid())
    assert status_kb(child.pid) == {}, "gone: nothing to read"
