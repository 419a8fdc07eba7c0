"""`make dev-up` / `make dev-down`: the background dev stack starts, is usable, and leaves nothing.

The stack is a real one-node cluster with the chart installed by helm and a demo app whose pods
get the sidecar from the webhook. Each test drives `python -m testbed.devstack` as a
subprocess, as make does, with its state in a private SCHEDLOCK_DEV_DIR so a developer's own
stack in .dev/ is never touched, and with no other cluster on the host (`cluster_free_host`):
`down` must leave no process and the host as it was.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from testbed.node.host import HostState, host_state_differences
from testbed.node.plan import SHORT_SOCKET_DIR
from testbed.pg import pg_bindir
from testbed.tools import tool

REPO = Path(__file__).resolve().parents[2]
# A node, `helm install --wait`, two app pods: about a minute warm. The budget is only a guard
# against a hang; `up` has its own deadline.
UP_BUDGET_SECONDS = 300
REASSERT_DEFAULT = 30  # charts/schedlock/values.yaml operator.reassertSeconds
NODE_PROCESSES = {
    "etcd",
    "kube-apiserver",
    "containerd",
    "kubelet",
    "kube-controller-manager",
    "kube-scheduler",
    "kube-proxy",
}


def devstack(dev_dir: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """Run the CLI like `make` does. capture_output also proves the detached supervisor does
    not hold our pipes: run() would wait for it otherwise."""
    return subprocess.run(
        [sys.executable, "-m", "testbed.devstack", *args],
        cwd=REPO,
        env={**os.environ, "SCHEDLOCK_DEV_DIR": str(dev_dir)},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def running(pid: int) -> bool:
    """Whether PID is a live process. A zombie is not: the supervisor is re-parented to init
    when `up` exits, and reaping it is init's business."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def wait_until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.1)


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text() if entry.name.isdigit() else ""
        except OSError:
            continue
        if stat and int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def stack_pids(state: dict[str, Any]) -> dict[str, int]:
    pids = {"supervisor": int(state["supervisor"]["pid"])}
    for component in state["components"].values():
        pids.update({proc["name"]: int(proc["pid"]) for proc in component["processes"]})
    return pids


def in_env(dev_dir: Path, script: str) -> subprocess.CompletedProcess[str]:
    """Run SCRIPT in bash after `source <dev_dir>/env`, with a PATH that has nothing else on it:
    whatever the script finds, the env file put there."""
    return subprocess.run(
        ["/bin/bash", "-c", f"source {dev_dir / 'env'} && {script}"],
        env={"HOME": os.environ.get("HOME", "/"), "PATH": "/nonexistent"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def dev_dir(tmp_path: Path, cluster_free_host: None) -> Iterator[Path]:
    """A private state directory; the stack is brought down whatever the test did, and the
    host is then exactly as before `up`."""
    path = tmp_path / "dev"
    before = HostState.capture()
    yield path
    result = devstack(path, "down")
    assert result.returncode == 0, result.stdout + result.stderr
    assert host_state_differences(before, HostState.capture()) == []
    assert _processes_of(path) == [], "processes of the stack survived `down`"


def _processes_of(dev_dir: Path) -> list[str]:
    """Processes still naming the stack's directory or the node's socket directory, or running
    in the stack's directory: containerd's shims are re-parented to init and name neither the
    supervisor nor a recorded pid."""
    markers = [str(dev_dir), str(SHORT_SOCKET_DIR)]
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if any(m in args for m in markers) or cwd.startswith(str(dev_dir)):
            found.append(f"{entry.name}: {args[:200]}")
    return found


def up(dev_dir: Path) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    began = time.monotonic()
    result = devstack(dev_dir, "up")
    elapsed = time.monotonic() - began
    assert result.returncode == 0, result.stdout + result.stderr
    assert elapsed < UP_BUDGET_SECONDS, f"`up` took {elapsed:.1f}s"
    state = json.loads((dev_dir / "state.json").read_text())
    assert state["status"] == "ready"
    pids = stack_pids(state)
    assert set(pids) == {"supervisor", "postgres", *NODE_PROCESSES}
    assert all(running(pid) for pid in pids.values()), pids
    return result, state


def _sql(dev_dir: Path, query: str) -> str:
    return in_env(dev_dir, f'psql "$DATABASE_URL" -qtAc {shlex.quote(query)}').stdout.strip()


def _usage(stdout: str) -> list[str]:
    """What `up` prints after saying the stack is up (or already up)."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("==> the dev stack is"))
    return lines[start + 1 :]


def test_up_is_usable_idempotent_and_down_leaves_no_process(dev_dir: Path) -> None:
    first, state = up(dev_dir)
    assert "the dev stack is up" in first.stdout
    assert "source " in first.stdout, first.stdout
    assert "psql" in first.stdout, first.stdout
    assert (dev_dir / "supervisor.pid").read_text().strip() == str(state["supervisor"]["pid"])

    readyz = subprocess.run(
        [
            str(tool("kubectl")),
            "--kubeconfig",
            str(dev_dir / "kubeconfig"),
            "get",
            "--raw",
            "/readyz",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert readyz.stdout.strip() == "ok", readyz.stdout + readyz.stderr

    # Everything runs in pods, as users install it: the operator from the chart, CoreDNS, and
    # the demo app's two pods with the injected sidecar (2/2).
    pods = json.loads(in_env(dev_dir, "kubectl get pods -A -o json").stdout)["items"]
    by_app: dict[str, list[dict[str, Any]]] = {}
    for pod in pods:
        labels = pod["metadata"].get("labels", {})
        name = labels.get("app.kubernetes.io/name") or labels.get("k8s-app", "?")
        by_app.setdefault(str(name), []).append(pod)
        assert pod["status"]["phase"] == "Running", pod["metadata"]["name"]
    assert len(by_app["schedlock"]) == 1 and len(by_app["demo"]) == 2, sorted(by_app)
    assert len(by_app["kube-dns"]) == 1, sorted(by_app)
    for pod in by_app["demo"]:
        statuses = pod["status"]["containerStatuses"] + [
            s for s in pod["status"].get("initContainerStatuses", []) if s["name"] == "schedlock"
        ]
        assert [s["ready"] for s in statuses] == [True, True], pod["status"]

    # The product runs on it: the example fires for real and its status says so.
    example = REPO / "examples" / "scheduledpublish.yaml"
    applied = in_env(dev_dir, f"kubectl apply -f {example}")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    wait_until(
        lambda: (
            in_env(
                dev_dir, "kubectl get sp launch-announcement -o jsonpath={.status.phase}"
            ).stdout.strip()
            == "Published"
        ),
        timeout=60,
        what="the example ScheduledPublish to be Published",
    )
    # It reached the demo app: the app logs one JSON line per delivery.
    logs = in_env(dev_dir, "kubectl logs -l app.kubernetes.io/name=demo -c app --tail=-1")
    assert '"name":"launch-announcement"' in logs.stdout, logs.stdout + logs.stderr
    listed = in_env(dev_dir, "kubectl get sp")
    assert "launch-announcement" in listed.stdout and "Published" in listed.stdout

    # Level-triggered (issue 14): the row of a future object deleted behind the operator's back
    # comes back within the chart's default re-assertion interval, and the object still fires.
    at = (datetime.now(UTC) + timedelta(seconds=REASSERT_DEFAULT + 15)).isoformat()
    future = {
        "apiVersion": "schedlock.dev/v1",
        "kind": "ScheduledPublish",
        "metadata": {"name": "lost-row", "namespace": "default"},
        "spec": {"target": "demo", "publishAt": at.replace("+00:00", "Z")},
    }
    applied = in_env(dev_dir, f"echo {shlex.quote(json.dumps(future))} | kubectl apply -f -")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    uid = in_env(dev_dir, "kubectl get sp lost-row -o jsonpath={.metadata.uid}").stdout.strip()
    row = f"SELECT count(*) FROM schedlock_publishes WHERE uid = '{uid}' AND state = 'scheduled'"
    wait_until(lambda: _sql(dev_dir, row) == "1", 30, "the operator to write lost-row's row")
    deleted = _sql(dev_dir, f"DELETE FROM schedlock_publishes WHERE uid = '{uid}' RETURNING 1")
    assert deleted == "1"
    began = time.monotonic()
    wait_until(lambda: _sql(dev_dir, row) == "1", REASSERT_DEFAULT + 5, "the row to come back")
    print(f"lost-row's row re-asserted after {time.monotonic() - began:.1f} s")
    wait_until(
        lambda: (
            in_env(dev_dir, "kubectl get sp lost-row -o jsonpath={.status.phase}").stdout.strip()
            == "Published"
        ),
        timeout=REASSERT_DEFAULT + 60,
        what="lost-row to fire and be Published",
    )

    # The env file alone makes psql, kubectl and schedlock work, against this stack.
    select = in_env(dev_dir, 'psql "$DATABASE_URL" -tAc "select 1"')
    assert select.stdout.strip() == "1", select.stdout + select.stderr
    through_env = in_env(dev_dir, "kubectl get --raw /readyz && echo && schedlock --version")
    assert through_env.returncode == 0, through_env.stdout + through_env.stderr
    assert through_env.stdout.splitlines()[0] == "ok"
    assert through_env.stdout.splitlines()[1].startswith("schedlock ")
    found = in_env(
        dev_dir,
        'command -v psql kubectl helm promtool schedlock && echo "$KUBECONFIG" '
        '&& [ "$DATABASE_URL" = "$SCHEDLOCK_DATABASE_URL" ] && echo "$DATABASE_URL" '
        '&& echo "$CLUSTER_DATABASE_URL"',
    )
    assert found.stdout.splitlines() == [
        str(pg_bindir() / "psql"),
        str(tool("kubectl")),
        str(tool("helm")),
        str(tool("promtool")),
        str(REPO / ".venv" / "bin" / "schedlock"),
        str((dev_dir / "kubeconfig").resolve()),
        state["components"]["postgres"]["url"],
        state["components"]["postgres"]["cluster_url"],
    ], found.stdout + found.stderr
    # Pods reach the database by a Service name: the operator's Secret names it.
    assert ".svc.cluster.local:" in state["components"]["postgres"]["cluster_url"]
    # The operator in its pod reaches the database through that name (it migrated the schema).
    leaders = in_env(dev_dir, "schedlock status")
    assert leaders.returncode == 0 and "demo" in leaders.stdout, leaders.stdout + leaders.stderr

    status = devstack(dev_dir, "status")
    assert status.returncode == 0, status.stdout + status.stderr
    assert "is up" in status.stdout
    assert state["components"]["postgres"]["url"] in status.stdout
    assert state["components"]["cluster"]["url"] in status.stdout

    # A second `up` changes nothing and prints the same usage.
    began = time.monotonic()
    again = devstack(dev_dir, "up")
    assert again.returncode == 0, again.stdout + again.stderr
    assert time.monotonic() - began < 10
    assert "already up" in again.stdout
    assert _usage(again.stdout) == _usage(first.stdout)
    assert json.loads((dev_dir / "state.json").read_text()) == state

    pids = stack_pids(state)
    down = devstack(dev_dir, "down")
    assert down.returncode == 0, down.stdout + down.stderr
    assert "stopped" in down.stdout
    assert "SIGKILL" not in down.stdout, down.stdout  # the graceful path sufficed
    left = {name: pid for name, pid in pids.items() if running(pid)}
    assert not left, f"processes of the stack survived `down`: {left}"
    for name in ("supervisor.pid", "state.json", "env", "kubeconfig"):
        assert not (dev_dir / name).exists(), name
    assert not Path(state["components"]["postgres"]["data"]).exists()

    again = devstack(dev_dir, "down")
    assert again.returncode == 0
    assert "not running" in again.stdout
    status = devstack(dev_dir, "status")
    assert status.returncode == 3
    assert "not running" in status.stdout


def test_supervisor_stops_the_stack_when_a_server_dies(dev_dir: Path) -> None:
    _, state = up(dev_dir)
    pids = stack_pids(state)
    os.kill(pids["postgres"], signal.SIGKILL)

    wait_until(lambda: not any(running(pid) for pid in pids.values()), 30, "the stack to stop")
    status = devstack(dev_dir, "status")
    assert status.returncode == 3
    assert "last run failed" in status.stdout, status.stdout
    assert "postgres" in status.stdout, status.stdout
    assert not (dev_dir / "env").exists()

    down = devstack(dev_dir, "down")
    assert down.returncode == 0
    assert "not running" in down.stdout, down.stdout
    assert "last run failed" in down.stdout, down.stdout
    assert not (dev_dir / "state.json").exists()


def test_down_cleans_up_after_a_killed_supervisor(dev_dir: Path) -> None:
    """The node's processes die with the supervisor, PostgreSQL and the pods' shims would not:
    down kills them and restores the host (the fixture checks it)."""
    _, state = up(dev_dir)
    pids = stack_pids(state)
    # PostgreSQL's own children setsid(): killing the postmaster's group does not reach them.
    postgres_children = children(pids["postgres"])
    assert postgres_children
    pids.update({f"postgres child {pid}": pid for pid in postgres_children})
    os.kill(pids["supervisor"], signal.SIGKILL)
    wait_until(lambda: not running(pids["supervisor"]), 10, "the supervisor to die")

    down = devstack(dev_dir, "down")
    assert down.returncode == 0, down.stdout + down.stderr
    assert "not running" in down.stdout
    left = {name: pid for name, pid in pids.items() if running(pid)}
    assert not left, f"processes of the stack survived `down`: {left}"
    assert not Path(state["components"]["postgres"]["data"]).exists()

    # And the next `up` starts a fresh stack in the same directory.
    _, fresh = up(dev_dir)
    assert fresh["supervisor"]["pid"] != state["supervisor"]["pid"]


def test_down_kills_a_supervisor_that_does_not_stop_in_time(dev_dir: Path) -> None:
    _, state = up(dev_dir)
    pids = stack_pids(state)
    os.kill(pids["supervisor"], signal.SIGSTOP)  # it cannot act on SIGTERM now

    began = time.monotonic()
    down = devstack(dev_dir, "down", "--timeout", "1")
    assert down.returncode == 0, down.stdout + down.stderr
    assert time.monotonic() - began < 15
    assert "stopped" in down.stdout
    assert "did not exit" in down.stderr, down.stderr
    left = {name: pid for name, pid in pids.items() if running(pid)}
    assert not left, f"processes of the stack survived `down`: {left}"
